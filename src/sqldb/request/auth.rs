//! A request's role: its bearer token verified (`sqldb_jwt_key`), the role
//! claim read, or the anonymous role; and the preamble's parameters (role,
//! claims, `sqldb_setting` values).

use std::ffi::CString;
use std::rc::Rc;

use gateway_core::jwt::{bearer_token, Claims};

use super::error::{Error, Kind};
use crate::ffi::*;
use crate::sqldb::config::LocConf;
use crate::sqldb::driver::Preamble;

/// The verified claims of a request (for `$sqldb_jwt_claim_NAME`).
pub struct Authorized {
    pub claims: Option<Rc<Claims>>,
    pub preamble: Option<Preamble>,
}

fn unauthorized(why: impl Into<String>, invalid: bool) -> Error {
    Error::because(Kind::Unauthorized { invalid }, why)
}

/// Seconds since the epoch, by nginx's clock.
fn now() -> time_t {
    // SAFETY: ngx_cached_time points at nginx's current time slot, updated
    // by the worker's own thread.
    unsafe { ngx_cached_time.as_ref() }.map_or(0, |t| t.sec)
}

/// The role and claims of the request, and the preamble for its query.
pub fn authorize(r: &mut Req, lcf: &LocConf) -> Result<Authorized, Error> {
    let Some(pre) = lcf.preamble.clone() else {
        return Ok(Authorized {
            claims: None,
            preamble: None,
        });
    };
    let mut params = Vec::with_capacity(2 + 2 * lcf.settings.len());
    let mut claims = None;
    if let Some(jwt) = &lcf.jwt {
        let (role, json) = match r.authorization().map(|h| h.to_vec()) {
            Some(header) => {
                let Some(token) = bearer_token(&header) else {
                    return Err(unauthorized("the Authorization header is not \"Bearer TOKEN\"", true));
                };
                let verified = match jwt.cache.try_borrow_mut() {
                    Ok(mut cache) => cache.verify(&jwt.keys, token, now(), lcf.jwt_leeway),
                    Err(_) => jwt.keys.verify(token, now(), lcf.jwt_leeway).map(Rc::new),
                };
                let c = verified.map_err(|e| unauthorized(format!("invalid token: {e}"), true))?;
                let path: &[String] = lcf.jwt_role_claim.as_deref().map_or(&[], |p| &p[..]);
                let role = match c.get_path(path) {
                    Some(role) => CString::new(role).map_err(|_| unauthorized("the role claim holds a NUL", true))?,
                    None => match &lcf.anonymous_role {
                        Some((anon, _)) => (**anon).clone(),
                        None => {
                            return Err(unauthorized(
                                format!("the token has no \"{}\" claim", path.join(".")),
                                true,
                            ))
                        }
                    },
                };
                let json = CString::new(c.json()).map_err(|_| unauthorized("claims with a NUL", true))?;
                claims = Some(c);
                (role, json)
            }
            None => match &lcf.anonymous_role {
                Some((anon, _)) => ((**anon).clone(), c"{}".to_owned()),
                None => return Err(unauthorized("no bearer token", false)),
            },
        };
        // set_config('role', 'none') is RESET ROLE: the login role's rights.
        if role.as_bytes() == b"none" {
            return Err(Kind::RoleNone.into());
        }
        params.push(role);
        params.push(json);
    }
    for s in &lcf.settings {
        params.push(s.name.clone());
        let v = r.complex_value(s.value).ok_or(Kind::Nginx)?;
        params.push(CString::new(v).map_err(|_| Kind::SettingNul(s.name.to_string_lossy().into_owned()))?);
    }
    let read_only = pre.with_role && (r.method() & (NGX_HTTP_GET | NGX_HTTP_HEAD)) != 0;
    let text = if read_only { &pre.ro } else { &pre.rw };
    Ok(Authorized {
        claims,
        preamble: Some(Preamble {
            sql: Rc::clone(&text.sql),
            name: Rc::clone(&text.name),
            named: lcf.prepare == 1,
            params,
            with_role: pre.with_role,
            read_only,
            session: Rc::clone(&pre.session),
        }),
    })
}
