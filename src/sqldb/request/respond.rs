//! What the driver delivers, applied to its request; and the answer once
//! every result is in: the error, the rewrite, sqldb_set, the output.

use gateway_core::pipeline::Lost;

use super::error::{log_failure, Error, Failure, Kind, BAD_PARAMETER, ROLE_DENIED};
use super::peer::{fail, finish_upstream, guard_request, move_unsent, next, next_unfit, started};
use super::{ctx_of, output, vars};
use crate::common::token as registry;
use crate::debug;
use crate::ffi::*;
use crate::sqldb::config::{LocConf, Sqldb, TemplatePiece, Var};
use crate::sqldb::driver::{Delivery, PgResult, ReqToken, ResultKind};

pub(super) fn token_of(d: &Delivery) -> ReqToken {
    match d {
        Delivery::Started(t, _)
        | Delivery::Result(t, _)
        | Delivery::Error(t, _)
        | Delivery::Complete(t)
        | Delivery::Failed(t, ..)
        | Delivery::Refused(t, _)
        | Delivery::PreambleFailed(t, _)
        | Delivery::Unfit(t, _) => *t,
    }
}

/// One delivery of the driver, to its request (if it is still there).
pub fn deliver(d: Delivery) {
    registry::with_request(token_of(&d), |r| {
        r.set_log_request();
        // Taken now: apply may finalize the request, which frees it.
        let posted = r.posted();
        guard_request(r, "sqldb delivery", |r| apply(r, d));
        posted.run();
    });
}

fn apply(r: &mut Req, d: Delivery) {
    let log = r.log();
    let Some(ctx) = ctx_of(r) else { return };
    match d {
        Delivery::Started(_, connecting) => started(r, connecting),
        Delivery::Result(_, res) => ctx.last = Some(res),
        Delivery::Error(_, res) => {
            ctx.error.get_or_insert(res);
        }
        Delivery::PreambleFailed(_, res) => {
            if ctx.error.is_none() {
                ctx.error = Some(res);
                ctx.preamble_failed = true;
            }
        }
        Delivery::Complete(_) => {
            ctx.conn = None;
            complete(r);
        }
        Delivery::Refused(_, why) => {
            ctx.conn = None;
            let e = Error::because(Kind::Refused, why);
            log_failure(log, &e);
            fail(r, e.status(), false);
        }
        Delivery::Unfit(_, why) => {
            ctx.conn = None;
            crate::log!(
                NGX_LOG_INFO,
                log,
                "sqldb: {why}, not what \"sqldb_target {}\" asks: trying another server",
                ctx.query.target.get()
            );
            next_unfit(r);
        }
        Delivery::Failed(_, lost, why) => {
            ctx.conn = None;
            let e = Error::because(Kind::Lost(lost), why);
            match ctx.streaming.as_ref().filter(|s| s.started()) {
                Some(s) => super::stream::log_cut_short(log, NGX_LOG_ERR, s.sent, &e),
                // Not sent: it moves on (the connection said why, once).
                None if lost == Lost::NotSent => debug!(log, "sqldb: {e}: the query moves on"),
                None => log_failure(log, &e),
            }
            match lost {
                Lost::NotSent => move_unsent(r),
                Lost::Connect => next(r, HTTP_BAD_GATEWAY, NGX_HTTP_UPSTREAM_FT_ERROR),
                Lost::Sent => fail(r, e.status(), true),
            }
        }
    }
}

/// Ends the request with the error's status, after its log line.
fn fail_with(r: &mut Req, e: Error) {
    log_failure(r.log(), &e);
    fail(r, e.status(), false);
}

/// All results are in: answer the client.
fn complete(r: &mut Req) {
    let lcf: &'static LocConf = r.loc_conf::<Sqldb>();
    let Some(ctx) = ctx_of(r) else { return };
    if ctx.done {
        return;
    }
    if let Some(s) = ctx.streaming.as_mut().filter(|s| s.begun()) {
        // Rows went out, or every row is in: the stream ends the response.
        // An error before any byte went out still gets its own status.
        if s.started() || ctx.error.is_none() {
            return super::stream::complete(r);
        }
        s.drop_gathered();
    }
    if let Some(err) = ctx.error.take() {
        // The role its query ran as (`sqldb_jwt_key`): the preamble's first
        // parameter (read here, on an error, not kept for every request).
        let role = (lcf.jwt.is_some())
            .then(|| ctx.query.preamble.as_ref().and_then(|p| p.params.first()))
            .flatten()
            .map(|c| c.to_string_lossy().into_owned());
        let summary = err.error_summary();
        let stored = summary.clone();
        // A value the server cannot read as its parameter's type is the
        // client's mistake: 400, logged as client errors are.
        // The role cannot be set: it does not exist (22023), or the login
        // role may not switch to it (42501).
        let e = if ctx.preamble_failed && ROLE_DENIED.contains(&err.sqlstate().as_str()) && role.is_some() {
            Error::role_denied(role.unwrap_or_default(), &summary)
        } else if role.is_some() && err.sqlstate() == "42501" {
            // The request's role may not do this (a grant it lacks, a
            // row-level security check): the role's, not the server's.
            Error::because(Kind::Forbidden, summary)
        } else if (ctx.has_params || ctx.preamble_failed) && BAD_PARAMETER.contains(&err.sqlstate().as_str()) {
            // (The preamble's values are the request's too: a setting of
            // bytes that are not text, say.)
            Error::because(Kind::BadParameter, summary + &empty_parameters(r))
        } else {
            Error::because(Kind::Query, summary)
        };
        vars::store(r, Var::Error, stored.as_bytes());
        return fail_with(r, e);
    }
    let Some(res) = ctx.last.take() else {
        return fail_with(r, Kind::NoResult.into());
    };
    if res.kind() == ResultKind::Empty {
        return fail_with(r, Kind::NoStatement.into());
    }
    answer(r, &res);
}

/// The answer of a result: a rewrite to 300 or more (nginx's page, before
/// sqldb_set is looked at), or sqldb_set's variables and the output.
fn answer(r: &mut Req, res: &PgResult) {
    let lcf: &LocConf = r.loc_conf::<Sqldb>();
    vars::store_counts(r, res);
    if let Some(u) = r.upstream() {
        let elapsed = u.elapsed();
        if let Some(st) = u.state() {
            st.header_time = elapsed;
        }
    }
    let rewritten = vars::rewrite(r, lcf, res);
    if let Some((status, false)) = rewritten.filter(|&(s, _)| s >= 300) {
        finish_upstream(r, HTTP_OK, 0);
        r.finalize(status as ngx_int_t);
        return;
    }
    if let Err(e) = vars::apply_sets(r, lcf, res) {
        return fail_with(r, e);
    }
    finish_upstream(r, HTTP_OK, 0);
    // `=code`, or a code below 300: the result with that status.
    let status = rewritten.map_or(HTTP_OK as ngx_uint_t, |(s, _)| s);
    let rc = match output::send(r, res, lcf.output(), status) {
        Ok(rc) => rc,
        Err(e) => {
            log_failure(r.log(), &e);
            e.status()
        }
    };
    r.finalize(rc);
}

/// For the log line of a rejected value: the typed parameters of the
/// request's template whose values were empty (a variable that is not set,
/// or a misspelt `$arg_` name, is empty), as "; empty: $arg_id::int".
fn empty_parameters(r: &mut Req) -> String {
    let lcf = r.loc_conf::<Sqldb>();
    let Some(tmpl) = lcf.queries.select(r.method()).cloned() else {
        return String::new();
    };
    let mut empty = Vec::new();
    for piece in &tmpl.pieces {
        if let TemplatePiece::Param(cv, ph) = piece {
            if r.complex_value(*cv).is_some_and(|v| v.is_empty()) {
                let cast = ph.iter().position(|&b| b == b':').map_or(&[][..], |at| &ph[at..]);
                empty.push(format!("{}{}", cv.source(), String::from_utf8_lossy(cast)));
            }
        }
    }
    if empty.is_empty() {
        String::new()
    } else {
        format!("; empty: {}", empty.join(", "))
    }
}
