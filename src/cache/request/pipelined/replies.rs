//! The replies of a pipelined request, as its connection reads them
//! (driver::Sink): the status and header once the command's reply is in,
//! the value's bytes as they come (held for a client that is behind, up to
//! the worker's HOLD_MAX), and the outcome of each try.

use super::*;

request_handler! {
    /// The client took what was pending: the connection reads on.
    pub(super) fn client_writable(r) = ("cache client_writable", panic: |r: &mut Req| end(r, HTTP_INTERNAL_SERVER_ERROR)) {
        if shared_of(r).is_none_or(|s| s.done) {
            return;
        }
        let wev = r.client_write();
        if wev.take_timedout() {
            r.set_client_timed_out();
            log!(NGX_LOG_INFO, r.log(), "cache: client timed out while a value was sent");
            return end(r, HTTP_REQUEST_TIME_OUT);
        }
        let pool = r.pool();
        // SAFETY: null: only what is pending goes on.
        let rc = unsafe { r.output_filter(std::ptr::null_mut()) };
        let Some(s) = shared_of(r) else { return };
        s.bufs.update(&pool, None);
        if rc == ERROR {
            return end(r, ERROR);
        }
        if s.bufs.busy() > MAX_PENDING {
            r.wait_client_writable();
            return;
        }
        release_held(s);
        s.behind = false;
        let saved = s.saved_write_handler;
        let (paused, conn) = (std::mem::take(&mut s.paused), s.conn);
        r.client_caught_up();
        r.set_write_handler(saved);
        if paused {
            let lcf: &CacheLocConf = r.loc_conf::<Cache>();
            if let Some(t) = shared_of(r).and_then(|s| s.timer.as_ref()) {
                t.add_timer(lcf.upstream.read_timeout);
            }
            if let Some(id) = conn {
                driver::pipes().with(id, |c| c.resume());
            }
        }
    }
}

/// The status and headers of the answer, once (`head`).
fn send_head(r: &mut Req) {
    let Some(s) = shared_of(r) else { return };
    let Some((status, length, value)) = s.head.take() else {
        return;
    };
    s.started = true;
    r.set_status(ngx_uint_t::from(status));
    r.set_content_length(length);
    if value {
        r.allow_ranges();
    }
    let rc = if value && !super::super::gzip_flagged(r) {
        ERROR
    } else {
        r.send_header()
    };
    let header_only = r.header_only();
    let Some(s) = shared_of(r) else { return };
    if rc == ERROR || rc > OK || header_only {
        s.discard = true;
    }
    if rc > OK {
        s.refused_head = Some(rc);
    }
}

/// What was held for the request's client is not any more.
pub(super) fn release_held(s: &mut SharedReq) {
    let held = std::mem::take(&mut s.held);
    HELD.set(HELD.get().saturating_sub(held));
}

/// Runs `f` with the request of a handle, while it is there.
fn with_request<T>(who: &Handle, f: impl FnOnce(&mut Req) -> T) -> Option<T> {
    token::with_request(who.who.get()?, f)
}

/// The pipelined requests, as the driver's connections call them.
pub(super) struct RequestSide;

pub(super) static REQUEST_SIDE: RequestSide = RequestSide;

impl Sink for RequestSide {
    fn answer(&self, who: &Handle, status: u16, value: Option<u64>, made: Option<Vec<u8>>) {
        with_request(who, |r| {
            guard(r.log(), "cache answer", (), || answer(r, status, value, made))
        });
    }

    fn progress(&self, who: &Handle) {
        with_request(who, |r| {
            let lcf: &CacheLocConf = r.loc_conf::<Cache>();
            let Some(s) = shared_of(r) else { return };
            if s.done || s.paused {
                return;
            }
            if let Some(t) = &s.timer {
                t.add_timer(lcf.upstream.read_timeout);
            }
        });
    }

    fn value(&self, who: &Handle, bytes: &[u8], others: bool) -> bool {
        with_request(who, |r| {
            guard(r.log(), "cache value", false, || value(r, bytes, others))
        })
        .unwrap_or(false)
    }

    fn deliver(&self, out: &mut Vec<Outcome>) {
        for d in out.drain(..) {
            let who = match &d {
                Outcome::Connected(h) | Outcome::Done(h) | Outcome::Probed(h, _) | Outcome::Failed(h, _) => h.clone(),
            };
            with_request(&who, |r| {
                let posted = r.posted();
                let entry = if matches!(d, Outcome::Connected(_)) {
                    "cache connected"
                } else {
                    "cache reply"
                };
                guard_request(r, entry, |r| {
                    fault_point("delivery");
                    outcome(r, d)
                });
                posted.run();
            });
        }
    }
}

/// The command's reply is in: the answer's status, or another try.
fn answer(r: &mut Req, status: u16, value: Option<u64>, made: Option<Vec<u8>>) {
    let lcf: &CacheLocConf = r.loc_conf::<Cache>();
    let tries = r.upstream().map_or(0, |u| *u.tries());
    let Some(s) = shared_of(r) else { return };
    if status == 404 && lcf.upstream.next_upstream & NGX_HTTP_UPSTREAM_FT_HTTP_404 as ngx_uint_t != 0 && tries > 1 {
        s.retry_404 = true;
        return;
    }
    if status == 404 {
        // As for nginx's upstreams here (intercepted): nginx's own 404
        // page, or the location's error_page 404.
        s.intercept = Some(NGX_HTTP_NOT_FOUND as ngx_int_t);
        return;
    }
    let length = match (value, &made) {
        (Some(n), _) => n as off_t,
        (None, Some(b)) => b.len() as off_t,
        (None, None) => 0,
    };
    s.made = made;
    s.value_len = value;
    // The header goes out with the first bytes of the value (or at the
    // end): until then a failure is still a status of its own.
    s.head = Some((status, length, value.is_some()));
    if let Some(u) = r.upstream() {
        let elapsed = u.elapsed();
        if let Some(st) = u.state() {
            st.header_time = elapsed;
            st.status = ngx_uint_t::from(status);
            if st.connect_time == ngx_msec_t::MAX {
                st.connect_time = 0;
            }
        }
    }
}

/// Bytes of the value: on to the client. True when the connection must
/// pause (the client is behind and no more can be held for it).
fn value(r: &mut Req, bytes: &[u8], others: bool) -> bool {
    let (pool, main) = (r.pool(), r.is_main());
    let Some(s) = shared_of(r) else { return false };
    s.length += bytes.len() as u64;
    send_head(r);
    let Some(s) = shared_of(r) else { return false };
    if s.discard || !s.started {
        return false;
    }
    // The value's last bytes go out with the end (done), marked last now.
    let complete = s.value_len == Some(s.length) && s.tail.is_none();
    let Some(out) = s.bufs.fill(&pool, bytes, complete.then_some(main), BATCH) else {
        s.discard = true;
        return false;
    };
    if complete {
        s.tail = Some(out);
        return false;
    }
    // SAFETY: a chain of the request's pool (fill).
    let rc = unsafe { r.output_filter(out.as_ptr()) };
    let Some(s) = shared_of(r) else { return false };
    s.bufs.update(&pool, Some(out));
    if rc == ERROR {
        s.discard = true;
        return false;
    }
    if s.bufs.busy() <= MAX_PENDING {
        return false;
    }
    if !std::mem::replace(&mut s.behind, true) {
        // The client is behind: its pace now for what is pending (nginx's
        // send_timeout).
        let saved = r.write_handler();
        if let Some(s) = shared_of(r) {
            s.saved_write_handler = saved;
        }
        r.set_write_handler(Some(client_writable));
        r.wait_client_writable();
    }
    let Some(s) = shared_of(r) else { return false };
    // Others wait after it on the connection: held for the client, up to
    // the worker's limit.
    if others && HELD.get() + bytes.len() <= HOLD_MAX {
        HELD.set(HELD.get() + bytes.len());
        s.held += bytes.len();
        return false;
    }
    s.paused = true;
    if let Some(t) = &s.timer {
        t.del_timer();
    }
    true
}

/// What the connection reports of the request's exchange.
fn outcome(r: &mut Req, d: Outcome) {
    match d {
        Outcome::Connected(_) => connected(r),
        Outcome::Done(_) => done(r),
        Outcome::Probed(_, Ok(())) => {
            if let Some(id) = shared_of(r).and_then(|s| s.conn) {
                place(r, id);
            }
        }
        Outcome::Probed(_, Err(message)) => {
            let db = ctx_of(r).and_then(|c| c.db).unwrap_or_default();
            log!(
                NGX_LOG_INFO,
                r.log(),
                "cache: redis refused SELECT {db} (\"$cache_db\"): {}",
                String::from_utf8_lossy(&message)
            );
            // The client's mistake; the server answered.
            if let Some(s) = shared_of(r) {
                s.conn = None;
            }
            if r.has_error_page(HTTP_BAD_REQUEST) {
                end(r, HTTP_BAD_REQUEST);
            } else {
                respond_empty(r, HTTP_BAD_REQUEST);
            }
        }
        Outcome::Failed(_, f) => failed(r, f),
    }
}

/// The connection the request waited for is made: its commands go out,
/// and its reply is due within `cache_read_timeout`.
fn connected(r: &mut Req) {
    let lcf: &CacheLocConf = r.loc_conf::<Cache>();
    let Some(s) = shared_of(r) else { return };
    if s.done || s.paused {
        return;
    }
    // The connect timeout gives way to the read timeout, once per try (a
    // request that moves to another connection keeps its deadline).
    if std::mem::take(&mut s.timer_connecting) {
        if let Some(t) = &s.timer {
            t.del_timer();
            t.add_timer(lcf.upstream.read_timeout);
        }
    }
    if let Some(u) = r.upstream() {
        let elapsed = u.elapsed();
        if let Some(st) = u.state() {
            if st.connect_time == ngx_msec_t::MAX {
                st.connect_time = elapsed;
            }
        }
    }
}

/// Every reply is in: the rest of the response, and the end.
fn done(r: &mut Req) {
    let Some(s) = shared_of(r) else { return };
    if s.done {
        return;
    }
    s.conn = None;
    if s.retry_404 {
        return next(r, NGX_HTTP_UPSTREAM_FT_HTTP_404, true, false, Verdict::Answered);
    }
    if let Some(t) = &s.timer {
        t.clear();
    }
    if let Some(status) = s.intercept {
        return end(r, status);
    }
    let status = r.status() as ngx_int_t;
    finish_try(r, status, 0);
    if let Some(s) = shared_of(r) {
        s.done = true;
    }
    send_head(r);
    let header_only = r.header_only();
    let (pool, main) = (r.pool(), r.is_main());
    let Some(s) = shared_of(r) else { return };
    if !s.started {
        // (Cannot be: every exchange answers before it ends.)
        r.finalize(HTTP_BAD_GATEWAY);
        return;
    }
    if s.discard {
        let rc = match s.refused_head {
            Some(status) => status,
            None if header_only => OK,
            None => ERROR,
        };
        r.finalize(rc);
        return;
    }
    let rc = match s.made.take() {
        Some(body) => {
            match s.bufs.fill(&pool, &body, Some(main), BATCH) {
                // SAFETY: a chain of the request's pool (fill).
                Some(out) => unsafe { r.output_filter(out.as_ptr()) },
                None => ERROR,
            }
        }
        None => match s.tail.take() {
            Some(out) => {
                // SAFETY: a chain of the request's pool (fill).
                let rc = unsafe { r.output_filter(out.as_ptr()) };
                if let Some(s) = shared_of(r) {
                    s.bufs.update(&pool, Some(out));
                }
                rc
            }
            None => r.send_last(),
        },
    };
    r.finalize(rc);
}

/// The request's exchange failed.
pub(super) fn failed(r: &mut Req, f: Error) {
    let Some(s) = shared_of(r) else { return };
    if s.done {
        return;
    }
    s.conn = None;
    let started = s.started;
    let broken = match *f.kind() {
        Kind::Broken(b) => b,
        // An error reply is Redis's answer, never the server's failure;
        // one that says the server cannot take the command now (a
        // replica's READONLY) sends it on to the next server (next).
        _ if f.reply().is_some_and(|e| e.not_now()) && !started => {
            let name = server_name(r);
            log!(
                NGX_LOG_WARN,
                r.log(),
                "cache: {f}, from redis {name}: the next server takes the request, if there is one"
            );
            return next(r, NGX_HTTP_UPSTREAM_FT_INVALID_HEADER, true, false, Verdict::NotNow);
        }
        // A master that takes no writes while too few replicas are in
        // step: 503, to be asked again (the next server is no better).
        _ if f.reply().is_some_and(|e| e.no_replicas()) && !started => {
            log!(NGX_LOG_ERR, r.log(), "cache: {f}{}", super::super::NO_REPLICAS);
            if let Some(ctx) = ctx_of(r) {
                ctx.retry_after = true;
            }
            return end(r, HTTP_SERVICE_UNAVAILABLE);
        }
        _ => {
            log!(NGX_LOG_ERR, r.log(), "cache: {f}");
            if started {
                return end(r, ERROR);
            }
            return next(r, NGX_HTTP_UPSTREAM_FT_INVALID_HEADER, true, false, Verdict::Answered);
        }
    };
    let Broken {
        how,
        sent,
        reused,
        connecting,
    } = broken;
    let name = server_name(r);
    if how == How::PasswordRefused {
        // A refused password: logged once a minute at most, and no
        // other server is tried (one more connection for Redis).
        if let Some(k) = ctx_of(r).and_then(|c| c.auth_key) {
            authfail::refused(k, r.log(), format_args!("{f}, by redis {name}"));
        }
        return end(r, HTTP_BAD_GATEWAY);
    }
    let doing = if connecting {
        "connecting to"
    } else {
        "reading the reply from"
    };
    // A kept connection that the server closed is not worth an
    // error line when the request goes on to another.
    let level = if reused && how != How::Invalid && !started {
        NGX_LOG_WARN
    } else {
        NGX_LOG_ERR
    };
    if started {
        log!(
            NGX_LOG_ERR,
            r.log(),
            "cache: {f} while {doing} redis {name}; the response is cut short"
        );
        return end(r, ERROR);
    }
    log!(level, r.log(), "cache: {f} while {doing} redis {name}");
    if !sent {
        // (Queued, never written: not bytes sent to that server.)
        if let Some(s) = shared_of(r) {
            s.handle.sent.set(0);
        }
    }
    let ft = match how {
        How::TimedOut => NGX_HTTP_UPSTREAM_FT_TIMEOUT,
        How::Invalid => NGX_HTTP_UPSTREAM_FT_INVALID_HEADER,
        How::Closed | How::PasswordRefused => NGX_HTTP_UPSTREAM_FT_ERROR,
    };
    next(r, ft, sent, reused, Verdict::Failed)
}
