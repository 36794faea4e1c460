//! Authorization in the database: `sqldb_jwt_key`, `sqldb_jwt_leeway`,
//! `sqldb_jwt_role_claim`, `sqldb_anonymous_role` and `sqldb_setting`, and
//! the preamble they make: one statement sent before each request's query
//! in its sync segment (the same implicit transaction), that sets the role,
//! the claims, read-only for GET and HEAD, and the settings, each with
//! `set_config(..., true)`, so that all of it ends with the transaction
//! (or, where a session may keep the role, the texts of
//! driver/session.rs).

use std::ffi::CString;
use std::rc::Rc;

use std::cell::RefCell;

use gateway_core::jwt::{parse_claim_path, Alg, KeySet, TokenCache};

use super::LocConf;
use crate::ffi::conf::{ComplexValue, ConfError};
use crate::ffi::*;
use crate::sqldb::driver::{settings_calls, SessionTexts, Text};

/// `sqldb_jwt_key FILE [alg=...]`.
pub struct JwtConf {
    pub keys: KeySet,
    pub file: String,
    /// Tokens verified lately, in this worker (see TokenCache).
    pub cache: RefCell<TokenCache>,
}

/// Tokens a worker keeps verified, per `sqldb_jwt_key`.
pub const TOKEN_CACHE: usize = 512;

/// `sqldb_setting NAME VALUE`.
#[derive(Clone)]
pub struct Setting {
    pub name: CString,
    pub value: ComplexValue,
}

/// The preamble's SQL text for a location: read-write, and read-only (GET
/// and HEAD with a role).
pub struct PreambleSql {
    /// Each prepared once per connection, under its name.
    pub rw: Text,
    pub ro: Text,
    /// The role and the claims are its first two parameters.
    pub with_role: bool,
    /// The texts for sessions that keep the role between requests.
    pub session: Rc<SessionTexts>,
}

impl PreambleSql {
    /// `select pg_catalog.set_config('role', $1, true), pg_catalog.set_config('request.jwt.claims', $2, true)
    /// [, pg_catalog.set_config('transaction_read_only', 'on', true)], pg_catalog.set_config($3, $4, true), ...`
    /// (named with its schema: a `set_config` of another schema earlier in
    /// the session's search_path must not stand in for it).
    pub fn build(with_role: bool, settings: usize) -> Option<PreambleSql> {
        let text = |read_only: bool| {
            let mut calls = Vec::new();
            if with_role {
                calls.push("pg_catalog.set_config('role', $1, true)".to_owned());
                calls.push("pg_catalog.set_config('request.jwt.claims', $2, true)".to_owned());
                if read_only {
                    calls.push("pg_catalog.set_config('transaction_read_only', 'on', true)".to_owned());
                }
            }
            calls.extend(settings_calls(settings, if with_role { 3 } else { 1 }));
            Text::new(format!("select {}", calls.join(", ")))
        };
        if !with_role && settings == 0 {
            return None;
        }
        Some(PreambleSql {
            rw: text(false)?,
            ro: text(true)?,
            with_role,
            session: Rc::new(SessionTexts::build(with_role, settings)?),
        })
    }
}

directive_handler! {
    /// `sqldb_jwt_key FILE [alg=HS256|...]`
    pub(crate) fn cmd_sqldb_jwt_key = "cmd_sqldb_jwt_key",
    |cf: Conf, lcf: &mut LocConf| {
        if lcf.jwt.is_some() {
            return Err(crate::ffi::conf::duplicate("sqldb_jwt_key"));
        }
        let args = cf.args();
        let alg = match args.get(2) {
            None => None,
            Some(a) => {
                let name = a.strip_prefix(b"alg=").and_then(|n| std::str::from_utf8(n).ok());
                Some(name.and_then(Alg::parse).ok_or_else(|| {
                    format!(
                        "invalid parameter \"{}\" in \"sqldb_jwt_key\" directive, it must be alg=HS256, HS384, HS512, RS256, RS384, RS512, ES256, ES384 or EdDSA",
                        String::from_utf8_lossy(a)
                    )
                })?)
            }
        };
        let file = cf.full_name(args[1]).ok_or(ConfError::Logged)?;
        let bytes = std::fs::read(&file).map_err(|e| format!("\"sqldb_jwt_key\" cannot read \"{file}\": {e}"))?;
        let keys = KeySet::load(&bytes, alg).map_err(|e| format!("\"sqldb_jwt_key\" file \"{file}\": {e}"))?;
        lcf.jwt = Some(Rc::new(JwtConf {
            keys,
            file,
            cache: RefCell::new(TokenCache::new(TOKEN_CACHE)),
        }));
        Ok(())
    }
}

directive_handler! {
    /// `sqldb_jwt_role_claim NAME` (a dotted path)
    pub(crate) fn cmd_sqldb_jwt_role_claim = "cmd_sqldb_jwt_role_claim",
    |cf: Conf, lcf: &mut LocConf| {
        if lcf.jwt_role_claim.is_some() {
            return Err(crate::ffi::conf::duplicate("sqldb_jwt_role_claim"));
        }
        let v = cf.args()[1];
        let path = std::str::from_utf8(v).ok().and_then(parse_claim_path).ok_or_else(|| {
            format!(
                "invalid claim \"{}\" in \"sqldb_jwt_role_claim\" directive (a name, or names joined by dots)",
                String::from_utf8_lossy(v)
            )
        })?;
        lcf.jwt_role_claim = Some(Rc::new(path));
        Ok(())
    }
}

directive_handler! {
    /// `sqldb_anonymous_role ROLE`
    pub(crate) fn cmd_sqldb_anonymous_role = "cmd_sqldb_anonymous_role",
    |cf: Conf, lcf: &mut LocConf| {
        if lcf.anonymous_role.is_some() {
            return Err(crate::ffi::conf::duplicate("sqldb_anonymous_role"));
        }
        let v = cf.args()[1];
        let role = CString::new(v)
            .ok()
            .filter(|r| !r.as_bytes().is_empty() && r.as_bytes() != b"none")
            .ok_or_else(|| "empty or invalid role in \"sqldb_anonymous_role\" directive".to_owned())?;
        if role.as_bytes().starts_with(b"$") {
            return Err(format!(
                "the role \"{}\" in \"sqldb_anonymous_role\" directive is a name, not a variable",
                String::from_utf8_lossy(role.as_bytes())
            )
            .into());
        }
        lcf.anonymous_role = Some((Rc::new(role), cf.position()));
        Ok(())
    }
}

directive_handler! {
    /// `sqldb_setting NAME VALUE` (the value may hold variables)
    pub(crate) fn cmd_sqldb_setting = "cmd_sqldb_setting",
    |cf: Conf, lcf: &mut LocConf| {
        let args = cf.args();
        let name = args[1];
        // A custom setting: identifiers joined by dots, as PostgreSQL
        // takes them in set_config (its own parameters are not for this
        // directive).
        if !gateway_core::sql::valid_setting_name(name) {
            return Err(format!(
                "invalid name \"{}\" in \"sqldb_setting\" directive (a prefix, a dot and a name, each a letter or _ then letters, digits, _ or $, like request.header.x)",
                String::from_utf8_lossy(name)
            )
            .into());
        }
        // The claims are the token's: a setting must not replace them
        // (setting names are case-insensitive).
        if name.eq_ignore_ascii_case(b"request.jwt.claims") {
            return Err(
                "\"sqldb_setting\" cannot set \"request.jwt.claims\", which holds the token's claims"
                    .to_owned()
                    .into(),
            );
        }
        if lcf
            .settings
            .iter()
            .any(|s| s.name.as_bytes().eq_ignore_ascii_case(name))
        {
            return Err(format!("\"sqldb_setting\" \"{}\" is duplicate", String::from_utf8_lossy(name)).into());
        }
        let value = cf.compile(args[2]).ok_or(ConfError::Logged)?;
        lcf.settings.push(Setting {
            name: CString::new(name).map_err(|_| ConfError::Logged)?,
            value,
        });
        Ok(())
    }
}
