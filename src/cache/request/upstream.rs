//! A cache request through nginx's upstream, the way nginx's memcached
//! module does it: `create_request` writes the commands (core's
//! `redis::plan`), `process_header` reads the replies up to the command's
//! own, the input filter streams a value to the client. Every reply is read
//! to its exact end (core's `redis::Exchange`) before the connection may be
//! kept.

use gateway_core::cluster::{self as kslot, RedirectKind};
use gateway_core::redis::{self, Event, ReplyError, Setup};
use gateway_core::resp;

use super::cluster::{log_refused, log_stop, MAX_REDIRECTS};
use super::{ctx_of, gzip_flagged, Ctx};
use crate::cache::config::Cache;
use crate::cache::driver::{authfail, next_ping};
use crate::ffi::upstream::{self, Callbacks};
use crate::ffi::*;
use crate::{debug, log};

pub(super) const CALLBACKS: Callbacks = Callbacks {
    create_request,
    reinit_request,
    process_header,
    abort_request: upstream::nothing_to_abort,
    finalize_request,
};

request_handler! {
    /// nginx ends the request through its upstream: one whose last try
    /// found no server to take it now says when to ask again.
    fn finalize_request(r, rc) = ("cache finalize_request") {
        super::tell_retry(r, rc);
    }
}

request_handler! {
    /// The commands (core's `redis::plan`): the head, the request body for
    /// SET, the tail.
    fn create_request(r) -> ngx_int_t = ("cache create_request", ERROR) {
        if build_request(r) {
            OK
        } else {
            ERROR
        }
    }
}

/// The request's commands and the reader of their replies (again for each
/// node of a cluster: what goes before the command depends on the node).
pub(super) fn build_request(r: &mut Req) -> bool {
    {
        let Some(sends_body) = ctx_of(r).map(|c| c.command.sends_body()) else {
            return false;
        };
        let (body, len) = if sends_body { r.body_bufs() } else { (Vec::new(), 0) };
        let pool = r.pool();
        let Some(ctx) = ctx_of(r) else { return false };
        let len = *ctx.body_len.get_or_insert(len);
        let plan = redis::plan(
            &redis::Request {
                command: ctx.command,
                key: &ctx.key,
                auth: ctx.auth.as_deref(),
                db: ctx.db,
                exptime: ctx.exptime,
                maxlen: ctx.maxlen,
                event: ctx.event.as_deref(),
                ping: next_ping(),
                cluster: ctx.cluster.as_ref().map(|c| c.steps),
            },
            len,
        );
        ctx.exchange = plan.exchange;
        let mut chain = Chain::new(&pool);
        let built = chain.push_bytes(plan.head).is_some()
            && body.into_iter().all(|b| chain.push(b).is_some())
            && (plan.tail.is_empty() || chain.push_bytes(plan.tail).is_some());
        if !built {
            return false;
        }
        chain.mark_flush();
        let Some(u) = r.upstream() else { return false };
        u.set_request_bufs(chain);
        true
    }
}

request_handler! {
    fn reinit_request(r) -> ngx_int_t = ("cache reinit_request", ERROR) {
        if let Some(ctx) = ctx_of(r) {
            ctx.exchange.restart();
            ctx.answered = false;
            ctx.carry.clear();
        }
        OK
    }
}

request_handler! {
    /// Reads the replies up to the command's own, which sets the status. A
    /// reply without a value is read here to the end of the request's last
    /// reply, so that a miss keeps its connection too.
    fn process_header(r) -> ngx_int_t = ("cache process_header", ERROR) {
        let (log, pool) = (r.log(), r.pool());
        let Some((u, ctx)) = r.upstream_and_ctx::<Cache>() else { return ERROR };
        if let Some(cr) = ctx.cluster.as_mut() {
            cr.spoke = true;
        }
        loop {
            // (A copy: the header and the first bytes of a value, one buffer at most.)
            let buf = u.unread().to_vec();
            let (event, used) = ctx.exchange.step(&buf);
            u.consume(used);
            if ctx.cluster.is_some() {
                // (A CLUSTER SLOTS reply is kept by the exchange as it comes.)
                u.rewind_if_used();
            }
            match event {
                Event::More => return AGAIN,
                Event::Slots(reply) => {
                    let Some(cr) = ctx.cluster.as_mut() else { return ERROR };
                    let Some((t, current)) = cr.topology().zip(cr.current) else {
                        return ERROR;
                    };
                    let rebuilt =
                        kslot::parse_slots(&reply).and_then(|ranges| t.borrow_mut().rebuild(&ranges, current));
                    if let Err(e) = rebuilt {
                        t.borrow_mut().mark_stale();
                        log_stop(log, format_args!("{e}, from redis cluster node {}", cr.node()));
                        cr.stop = true;
                        drop_unread(u);
                        return NGX_HTTP_UPSTREAM_INVALID_HEADER as ngx_int_t;
                    }
                    cr.refreshed = true;
                }
                Event::Redirect(rd) => {
                    let Some(cr) = ctx.cluster.as_mut() else { return ERROR };
                    cr.redirects += 1;
                    match rd.addr(cr.current) {
                        None => {
                            log_stop(
                                log,
                                format_args!(
                                    "redis cluster node {} answered \"{rd}\", which names no IP address",
                                    cr.node()
                                ),
                            );
                            cr.stop = true;
                        }
                        Some(_) if cr.redirects > MAX_REDIRECTS => {
                            log_stop(
                                log,
                                format_args!(
                                    "redis cluster redirected the request more than {MAX_REDIRECTS} times, the last time \"{rd}\" from {}",
                                    cr.node()
                                ),
                            );
                            cr.stop = true;
                        }
                        Some(addr) => {
                            let Some(t) = cr.topology() else { return ERROR };
                            let mut t = t.borrow_mut();
                            let trusted = match rd.kind {
                                RedirectKind::Moved => t.moved(rd.slot, addr),
                                RedirectKind::Ask => t.trusts(addr),
                            };
                            drop(t);
                            if trusted {
                                cr.redirect = Some((addr, rd.kind));
                            } else if !cr.refreshed {
                                // A node the map does not know: no byte goes
                                // there before a seed's map names it. The
                                // request goes to a seed, for a new map
                                // (and its answer: the key's node, or a
                                // redirection checked against that map).
                                cr.refresh = true;
                            } else {
                                debug!(
                                    log,
                                    "cache: redis cluster node {} answered \"{rd}\", refused",
                                    cr.node()
                                );
                                log_refused(
                                    log,
                                    addr,
                                    format_args!("\"{rd}\" from redis cluster node {}", cr.node()),
                                );
                                cr.stop = true;
                            }
                        }
                    }
                    // The connection goes (nginx's next step closes it).
                    drop_unread(u);
                    return NGX_HTTP_UPSTREAM_INVALID_HEADER as ngx_int_t;
                }
                Event::Answer { status, value } => {
                    if let Some(k) = ctx.auth_key {
                        authfail::accepted(k);
                    }
                    // A value that came whole with its header is checked to
                    // its end before the status goes out: one that does not
                    // end with CRLF is a malformed reply (502), not a 200
                    // cut short.
                    if value.is_some() {
                        if let Err(e) = ctx.exchange.check_value_end(u.unread()) {
                            log!(NGX_LOG_ERR, log, "cache: {e}");
                            cluster_garbage(ctx, &e);
                            if let Some(cr) = ctx.cluster.as_mut() {
                                cr.stop |= !cr.retry_invalid;
                            }
                            drop_unread(u);
                            return NGX_HTTP_UPSTREAM_INVALID_HEADER as ngx_int_t;
                        }
                    }
                    ctx.answered = true;
                    u.set_status(ngx_uint_t::from(status));
                    match (value, ctx.exchange.answer_body()) {
                        (Some(n), _) => {
                            u.set_content_length(n as off_t);
                            return if gzip_flagged(r) { OK } else { ERROR };
                        }
                        // PUBLISH's receivers, XADD's ID: as JSON (filter_init).
                        (None, Some(b)) => u.set_content_length(b.len() as off_t),
                        (None, None) => u.set_content_length(0),
                    }
                }
                Event::Done => {
                    // Only after an answer without a value: the exact end.
                    if u.unread().is_empty() {
                        u.set_keepalive(ctx.exchange.keeps());
                    } else {
                        log!(NGX_LOG_ERR, log, "cache: {}", ReplyError::Unsolicited);
                        cluster_garbage(ctx, &ReplyError::Unsolicited);
                        drop_unread(u);
                    }
                    return OK;
                }
                // A database Redis will not select is the client's: 400,
                // logged at info as nginx logs client errors. What follows
                // the refusal is not read: the connection goes (whatever
                // state it is in, none of it is kept).
                Event::Failed(ReplyError::Refused {
                    setup: Setup::Select,
                    message,
                }) => {
                    log!(
                        NGX_LOG_INFO,
                        log,
                        "cache: redis refused SELECT {} (\"$cache_db\"): {}",
                        ctx.db.unwrap_or_default(),
                        String::from_utf8_lossy(&message)
                    );
                    drop_unread(u);
                    u.set_status(HTTP_BAD_REQUEST as ngx_uint_t);
                    u.set_content_length(0);
                    return OK;
                }
                // A refused password: no other server is tried (it would
                // cost Redis one more connection), and the line comes once
                // a minute at most.
                Event::Failed(e @ ReplyError::Refused { setup: Setup::Auth, .. }) => {
                    let node = node_name(u);
                    if let Some(k) = ctx.auth_key {
                        authfail::refused(k, log, format_args!("{e}, by redis {node}"));
                    }
                    if let Some(cr) = ctx.cluster.as_mut() {
                        cr.stop = true;
                    }
                    *u.tries() = 0;
                    drop_unread(u);
                    return NGX_HTTP_UPSTREAM_INVALID_HEADER as ngx_int_t;
                }
                // An error reply: Redis's answer, never the server's
                // failure (see error_reply).
                Event::Failed(e) if e.not_now() || matches!(e, ReplyError::Failed { .. }) => {
                    return error_reply(u, ctx, &pool, log, &e);
                }
                Event::Failed(e) => {
                    log!(NGX_LOG_ERR, log, "cache: {e}");
                    cluster_garbage(ctx, &e);
                    if let Some(cr) = ctx.cluster.as_mut() {
                        cr.stop |= !cr.retry_invalid;
                    }
                    // The connection goes, and what it sent with it
                    // (said once, here, not again by the input filter).
                    drop_unread(u);
                    // A broken reply after the answer: the answer stands,
                    // the connection goes.
                    return if ctx.answered {
                        OK
                    } else {
                        NGX_HTTP_UPSTREAM_INVALID_HEADER as ngx_int_t
                    };
                }
                Event::Value(_) => return ERROR,
            }
        }
    }
}

/// A cluster node that sent what no working node sends: the map may be
/// wrong about it, so the next request asks a seed for a new one.
fn cluster_garbage(ctx: &Ctx, e: &ReplyError) {
    if let Some(t) = ctx.cluster.as_ref().and_then(|cr| cr.topology()) {
        if e.breaks_protocol() {
            t.borrow_mut().mark_stale();
        }
    }
}

/// The server of the try, for the log ("?" when the peer has no name).
fn node_name(u: &Reply) -> String {
    u.peer_addr().map_or_else(
        || "?".to_owned(),
        |(_, n)| String::from_utf8_lossy(n.as_bytes()).into_owned(),
    )
}

/// An error reply, which is never the server's failure (it is not counted
/// against max_fails). A server that cannot take the command now (a
/// replica that answers READONLY, one loading its data) has not run it: the
/// request goes on to the next server whatever cache_next_upstream says
/// (as a cluster's redirections do), so that a promoted replica serves as
/// soon as it can. Another error reply (WRONGTYPE, ERR ...) is Redis's
/// answer to the command: 502, or the next server with invalid_response.
fn error_reply(u: &mut Reply, ctx: &mut Ctx, pool: &Pool, log: Log, e: &ReplyError) -> ngx_int_t {
    if e.not_now() {
        let node = node_name(u);
        log!(
            NGX_LOG_WARN,
            log,
            "cache: {e}, from redis {node}: the next server takes the request, if there is one"
        );
        if let Some(t) = ctx.cluster.as_ref().and_then(|cr| cr.topology()) {
            t.borrow_mut().mark_stale();
        }
        if let Some(sr) = ctx.sentinel.as_mut() {
            sr.not_now = true;
        }
        drop_unread(u);
        let ft = (NGX_HTTP_UPSTREAM_FT_INVALID_HEADER | NGX_HTTP_UPSTREAM_FT_NON_IDEMPOTENT) as ngx_uint_t;
        if !u.next_upstream_on(pool, ft) {
            return ERROR;
        }
    } else if e.no_replicas() {
        // (502, as for any error reply, with when to ask again: finalize.)
        log!(NGX_LOG_ERR, log, "cache: {e}{}", super::NO_REPLICAS);
        ctx.retry_after = true;
        drop_unread(u);
    } else {
        log!(NGX_LOG_ERR, log, "cache: {e}");
        if let Some(cr) = ctx.cluster.as_mut() {
            cr.stop |= !cr.retry_invalid;
        }
        drop_unread(u);
    }
    if !u.not_failed(pool) {
        return ERROR;
    }
    NGX_HTTP_UPSTREAM_INVALID_HEADER as ngx_int_t
}

/// Drops the bytes read and not used: the connection they came on is not
/// kept, and nothing of them is passed on.
fn drop_unread(u: &mut Reply) {
    let n = u.unread().len();
    u.consume(n);
}

input_filter_init_handler! {
    pub(super) fn filter_init(r) = "cache input_filter_init", {
        let pool = r.pool();
        let Some((u, ctx)) = r.upstream_and_ctx::<Cache>() else { return ERROR };
        // nginx reads on while the length is not 0: any other value until
        // the exchange ends.
        u.set_length(ctx.exchange.expects_more() as off_t);
        if let (Some(b), true) = (ctx.exchange.answer_body(), ctx.answered) {
            // (Before any bytes after the header: they are replies, not body.)
            if !u.emit_copy(&pool, &b) {
                return ERROR;
            }
        }
        OK
    }
}

input_filter_handler! {
    /// Passes the value's bytes on as they arrive; the CRLF after it and
    /// the replies after the command are read and checked, not sent.
    pub(super) fn filter(r, bytes) = "cache input_filter", {
        let (log, pool) = (r.log(), r.pool());
        let Some((u, ctx)) = r.upstream_and_ctx::<Cache>() else { return ERROR };
        // SAFETY: the bytes are used within this call only.
        let fresh = unsafe { u.take_new(bytes.max(0) as usize) };
        let carried = !ctx.carry.is_empty();
        let owned;
        let mut input: &[u8] = if carried {
            let mut joined = std::mem::take(&mut ctx.carry);
            joined.extend_from_slice(fresh);
            owned = joined;
            &owned
        } else {
            fresh
        };
        loop {
            let (event, used) = ctx.exchange.step(input);
            match event {
                // (Value bytes are never carried: only partial reply lines are.)
                Event::Value(v) if !carried => {
                    if !u.emit(&pool, v) {
                        return ERROR;
                    }
                }
                Event::More => {
                    let rest = &input[used..];
                    if rest.len() > resp::MAX_LINE {
                        log!(NGX_LOG_ERR, log, "cache: redis sent a reply line that is too long");
                        u.set_length(0);
                        return ERROR;
                    }
                    ctx.carry = rest.to_vec();
                    return OK;
                }
                Event::Done => {
                    u.set_length(0);
                    if used == input.len() {
                        u.set_keepalive(ctx.exchange.keeps());
                    } else {
                        log!(NGX_LOG_ERR, log, "cache: {}", ReplyError::Unsolicited);
                        cluster_garbage(ctx, &ReplyError::Unsolicited);
                    }
                    return OK;
                }
                // Past the answer (its status is out): whatever the reply,
                // the answer stands and the connection goes. nginx reads an
                // input filter's NGX_ERROR and takes anything else as OK
                // (ngx_http_upstream.c): no next-upstream step from here.
                // (The command's own error reply is process_header's: the
                // replies read here are those of the setups after it.)
                Event::Failed(e) => {
                    log!(NGX_LOG_ERR, log, "cache: {e}");
                    cluster_garbage(ctx, &e);
                    u.set_length(0);
                    // A value that does not end as announced is cut short.
                    return if e == ReplyError::BadValueEnd { ERROR } else { OK };
                }
                Event::Value(_) | Event::Answer { .. } | Event::Slots(_) | Event::Redirect(_) => {
                    log!(NGX_LOG_ALERT, log, "cache: unexpected reply state");
                    u.set_length(0);
                    return ERROR;
                }
            }
            input = &input[used..];
        }
    }
}
