//! A request's start: the content handler, the request body, the template
//! for the method, the query built from it, and nginx's upstream set up.

use std::ffi::CString;
use std::rc::Rc;

use gateway_core::sql::has_several_statements;

use super::error::{log_failure, Error, Failure, Kind};
use super::{peer, vars, Ctx};
use crate::common::token as registry;
use crate::ffi::upstream::{self, Callbacks};
use crate::ffi::*;
use crate::log;
use crate::sqldb::config::upstream::sqldb_srv_conf;
use crate::sqldb::config::{LocConf, Output, Sqldb, Template, TemplatePiece, Var};
use crate::sqldb::driver::{Query, SqlText};

request_handler! {
    /// The location's content handler (set by `sqldb_pass`).
    pub(crate) fn content_handler(r) -> ngx_int_t = ("content_handler", HTTP_INTERNAL_SERVER_ERROR) {
        start(r)
    }
}

fn start(r: &mut Req) -> ngx_int_t {
    let lcf = r.loc_conf::<Sqldb>();
    r.disable_not_modified();
    if r.answer_under_way() {
        let err = Error::from(Kind::AnswerUnderWay);
        log_failure(r.log(), &err);
        return err.status();
    }
    if lcf.listen.is_some() {
        let rc = super::vars::escape(r);
        if rc != DECLINED {
            return rc;
        }
        return start_listening(r, lcf);
    }
    let err = if lcf.queries.is_empty() {
        Error::from(Kind::NoQuery)
    } else if lcf.queries.select(r.method()).is_none() {
        Error::from(Kind::MethodNotAllowed(
            String::from_utf8_lossy(r.method_name()).into_owned(),
        ))
    } else {
        // The body first, so that $request_body is there for the template.
        // (Reading it counts the request as in use until it is finalized.)
        let rc = r.read_body(Some(body_read));
        return if rc >= NGX_HTTP_SPECIAL_RESPONSE as ngx_int_t {
            rc
        } else {
            DONE
        };
    };
    log_failure(r.log(), &err);
    err.status()
}

/// `sqldb_listen`: the request subscribes (server-sent events).
fn start_listening(r: &mut Req, lcf: &'static LocConf) -> ngx_int_t {
    let (block, srv) = match upstream_of(r, lcf) {
        Ok(block) => match block.and_then(|b| Some((b, sqldb_srv_conf(b)?))) {
            Some(found) => found,
            None => return HTTP_INTERNAL_SERVER_ERROR,
        },
        Err(e) => {
            log_failure(r.log(), &e);
            return e.status();
        }
    };
    match super::listen::subscribe(r, lcf, block, srv) {
        Ok(rc) => rc,
        Err(crate::common::sse::Refused::BadChannel(v)) => {
            log!(
                NGX_LOG_INFO,
                r.log(),
                "sqldb: \"sqldb_listen\" channel \"{}\" is not an identifier (letters, digits, _ and $, at most 63 bytes)",
                v.escape_default()
            );
            HTTP_BAD_REQUEST
        }
        Err(crate::common::sse::Refused::NotAllowed) => HTTP_NOT_ALLOWED,
        Err(crate::common::sse::Refused::Nginx) => HTTP_INTERNAL_SERVER_ERROR,
    }
}

/// The upstream block of the request: named in the configuration, or by a
/// variable now.
fn upstream_of(r: &mut Req, lcf: &LocConf) -> Result<Option<&'static ngx_http_upstream_srv_conf_t>, Error> {
    let Some(cv) = lcf.pass_var else {
        return Ok(crate::ffi::conf::block_of(&lcf.upstream));
    };
    let name = r.complex_value(cv).ok_or(Kind::Nginx)?.to_vec();
    let umcf = r.main_conf::<ngx::http::NgxHttpUpstreamModule>();
    crate::ffi::conf::upstream_blocks(umcf)
        .find(|u| u.host.as_bytes().eq_ignore_ascii_case(&name) && sqldb_srv_conf(u).is_some())
        .map(Some)
        .ok_or_else(|| Error::from(Kind::NoUpstream(String::from_utf8_lossy(&name).into_owned())))
}

request_handler! {
    /// The request body is in: run the query (or answer with an error).
    fn body_read(r) = ("body_read", panic: |r: &mut Req| r.finalize(HTTP_INTERNAL_SERVER_ERROR)) {
        let rc = body_done(r);
        if rc != DONE {
            r.finalize(rc);
        }
    }
}

/// What the request comes to once its body is in: DONE while it runs.
fn body_done(r: &mut Req) -> ngx_int_t {
    // The literals now, as the query is built: nothing (a subrequest that
    // ran while the body came) can write the variables in between.
    let rc = super::vars::escape(r);
    if rc != DECLINED {
        return rc;
    }
    match run(r) {
        Ok(()) => DONE,
        Err(e) => {
            if *e.kind() != Kind::Nginx {
                log_failure(r.log(), &e);
            }
            if let Kind::Unauthorized { invalid } = *e.kind() {
                let value = if invalid {
                    "Bearer error=\"invalid_token\""
                } else {
                    "Bearer"
                };
                if !r.add_header("WWW-Authenticate", value) {
                    return HTTP_INTERNAL_SERVER_ERROR;
                }
            }
            e.status()
        }
    }
}

/// Builds the query and starts nginx's upstream (whose balancer picks the
/// server, and the driver a connection to it).
fn run(r: &mut Req) -> Result<(), Error> {
    let lcf: &'static LocConf = r.loc_conf::<Sqldb>();
    let tmpl = lcf.queries.select(r.method()).cloned().ok_or(Kind::NoQuery)?;
    if !r.body_into_memory() {
        return Err(Kind::BodyFile.into());
    }
    // The token first: a request without a usable one runs nothing.
    let auth = super::auth::authorize(r, lcf)?;
    let (sql, params) = build_query(r, &tmpl)?;
    let several = if tmpl.constant {
        tmpl.several
    } else {
        has_several_statements(sql.to_bytes())
    };
    if several && !params.is_empty() {
        return Err(Kind::ParamsInSeveral.into());
    }
    if several && auth.preamble.is_some() {
        return Err(Kind::SeveralWithRole.into());
    }
    vars::store(r, Var::Query, sql.to_bytes());
    let output = lcf.output();
    let streamable = lcf.stream == 1 && !several && lcf.sets.is_empty() && lcf.rewrites.is_empty();
    let stream_format = streamable.then(|| super::output::stream_format(output)).flatten();

    // The upstream: named in the configuration, or by a variable now.
    let block = upstream_of(r, lcf)?;
    let by_variable = match (lcf.pass_var, block) {
        (Some(_), Some(b)) => Some(r.pool().str(b.host.as_bytes()).ok_or(Kind::Nginx)?),
        _ => None,
    };
    if let Some((b, srv)) = block.and_then(|b| Some((b, sqldb_srv_conf(b)?))) {
        if super::pool_of(srv, |p| p.full()) {
            let name = String::from_utf8_lossy(b.host.as_bytes()).into_owned();
            return Err(Error::from(Kind::Busy {
                upstream: name,
                max: srv.settings.max,
            }));
        }
    }

    let pool = r.pool();
    let u = r.create_upstream().ok_or(Kind::Nginx)?;
    if let Some(host) = by_variable {
        if !u.set_resolved(&pool, host, None, 0) {
            return Err(Kind::Nginx.into());
        }
    }
    u.install(
        &lcf.upstream,
        "postgres://",
        <Sqldb as ngx::http::HttpModule>::module(),
        CALLBACKS,
    );

    let statement = (lcf.prepare == 1 && tmpl.constant && !several).then(|| tmpl.statement.clone());
    let query = Query {
        sql,
        params,
        statement,
        several,
        binary: output == Output::BinaryValue,
        streaming: stream_format.is_some(),
        stream_connections: lcf.stream_connections,
        changes_session: tmpl.changes_session,
        template: tmpl.statement.clone(),
        slow: tmpl.statement.slow.get() > 0,
        target: std::cell::Cell::new(lcf.target(r.method())),
        preamble: auth.preamble,
    };
    let token = registry::register(r);
    let ctx = Ctx {
        token,
        query: Rc::new(query),
        // Values from the request reach the SQL: as typed parameters, or as
        // variables in its text (escaped with sqldb_escape).
        has_params: tmpl.params > 0 || !tmpl.constant,
        srv: None,
        conn: None,
        fresh: false,
        unsent_moves: 0,
        rejected: None,
        unmet: None,
        last: None,
        error: None,
        done: false,
        peer: None,
        stream_format,
        streaming: None,
        stream_failed: false,
        saved_write_handler: None,
        claims: auth.claims,
        preamble_failed: false,
    };
    if r.set_ctx::<Sqldb>(ctx).is_none() {
        registry::unregister(token);
        return Err(Kind::Nginx.into());
    }
    r.upstream_init();
    // A connection was picked, unless the upstream already failed.
    peer::attach(r);
    Ok(())
}

/// nginx's upstream calls these; the query goes out on the driver's own
/// connections, so there is no request to create and no header to read.
const CALLBACKS: Callbacks = Callbacks {
    create_request: upstream::nothing_to_create,
    reinit_request: upstream::nothing_to_create,
    // (Never reached: nginx's reader is never installed on the stand-in.)
    process_header: upstream::no_header,
    abort_request: upstream::nothing_to_abort,
    finalize_request: peer::finalize_request,
};

const SQL_ROOM: usize = 256;

/// The SQL text and the values of its typed parameters for this request.
/// A constant template's text is its own, shared; only the values of its
/// parameters are the request's.
fn build_query(r: &mut Req, tmpl: &Template) -> Result<(SqlText, Vec<CString>), Error> {
    let shared = tmpl.sql.clone();
    // Room for a usual statement and the NUL CString::new adds: one
    // allocation, not a growth per piece and another for the NUL.
    let mut sql = Vec::with_capacity(if shared.is_some() { 0 } else { SQL_ROOM });
    let mut params = Vec::with_capacity(tmpl.params);
    for piece in &tmpl.pieces {
        let (cv, placeholder) = match piece {
            TemplatePiece::Text(_) if shared.is_some() => continue,
            TemplatePiece::Text(cv) => (*cv, None),
            TemplatePiece::Param(cv, ph) => (*cv, Some(ph)),
        };
        let v = r.complex_value(cv).ok_or(Kind::Nginx)?;
        match placeholder {
            None => sql.extend_from_slice(v),
            Some(ph) => {
                if shared.is_none() {
                    sql.extend_from_slice(ph);
                }
                params.push(CString::new(v).map_err(|_| Kind::ParamNul(params.len() + 1))?);
            }
        }
    }
    match shared {
        Some(s) if !s.is_empty() => Ok((SqlText::Shared(s), params)),
        Some(_) => Err(Kind::EmptyQuery.into()),
        None if sql.is_empty() => Err(Kind::EmptyQuery.into()),
        None => Ok((SqlText::Built(CString::new(sql).map_err(|_| Kind::QueryNul)?), params)),
    }
}
