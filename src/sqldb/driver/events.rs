//! What nginx's events on a database connection do: connect, send, read
//! the results and route them (core::pipeline), cancel the queries of
//! requests that are gone, and carry out what the routing asks.

use std::ptr::NonNull;
use std::rc::Rc;

use gateway_core::metrics::Id;
use gateway_core::pipeline::{Route, Step, Steps};
use gateway_core::rds::ResultSet as _;

use super::cancelling::cancel_again_event;
use super::pq::{Poll, ResultKind};
use super::terminate::{Ending, Terminator};
use super::{deliver, with_owner, worker, ConnId, ConnPool, Delivery, RowVerdict};
use crate::ffi::*;
use crate::{debug, log, metrics};

/// How long the queries of requests that are gone may take to end once
/// cancelled; then the connection is closed.
const DRAIN_TIMEOUT: ngx_msec_t = 5_000;

event_handler! {
    /// Read/write readiness or the timer of a database connection.
    pub(super) fn conn_event(ev) = "database connection event lookup", {
        let (timed_out, readable) = (ev.take_timedout(), !ev.is_write());
        let step = |pool: &mut ConnPool, id| {
            let mut out = super::out_list();
            let handled = guard(Log::cycle(), "database connection event", false, || {
                pool.on_event(id, readable, timed_out, &mut out);
                true
            });
            if !handled {
                // The connection's state is unknown after a panic: give up on it.
                pool.broken(id, "internal error", &mut out);
            }
            pool.show(id);
            (pool.sink, out)
        };
        // SAFETY: nginx calls this handler with an event of a connection's socket.
        let (sink, out) = unsafe { with_owner(&ev, step) };
        deliver(sink, out);
    }
}

event_handler! {
    /// Events of a session that ends a backend (terminate.rs).
    pub(super) fn terminate_event(ev) = "sqldb terminate event", {
        // SAFETY: nginx calls this handler with an event of the connection of
        // a Terminator, whose data is that Terminator, boxed in its pool (the
        // connection is released before the box is freed).
        let (pool, key) = unsafe {
            let t = &*(ev.connection_data() as *const Terminator);
            (t.pool, t.key)
        };
        let timed_out = ev.take_timedout();
        // SAFETY: a Terminator's pool is the worker's pool that owns it.
        unsafe { worker::lend(pool, |p| p.on_terminate_event(key, timed_out)) };
    }
}

impl ConnPool {
    fn on_event(&mut self, id: ConnId, readable: bool, timed_out: bool, out: &mut Vec<Delivery>) {
        let Some(c) = self.conn(id) else { return };
        if c.pipeline.is_connecting() {
            if timed_out && c.pipeline.depth() == 0 {
                // A spare (see spare.rs) that did not come up in time.
                let msg = format!(
                    "a spare connection was not up within {} ms",
                    super::spare::SPARE_CONNECT_TIMEOUT
                );
                return self.connect_failed(id, &msg, out);
            }
            self.connecting(id, out);
        } else if c.pipeline.is_draining() && timed_out {
            self.drain_expired(id, out);
        } else if c.pipeline.is_idle() {
            self.idle_event(id, readable, timed_out);
        } else if c.pipeline.is_draining() && c.pipeline.nothing_in_flight() {
            // Its queries are done, its cancel request not yet: only the
            // server closing the connection matters.
            if readable && (c.pg.consume_input().is_err() || c.pg.is_bad()) {
                let msg = format!("connection lost: {}", c.pg.error_message());
                self.broken(id, &msg, out);
            }
        } else {
            if let Err(e) = c.flush() {
                self.broken(id, &format!("sending to PostgreSQL failed: {e}"), out);
                return;
            }
            if c.pipeline.is_paused() {
                return;
            }
            // When reading fails, what arrived before (the server's reason
            // for closing, results) is still read first.
            if readable {
                let _ = c.pg.consume_input();
            }
            self.read_results(id, out);
        }
    }

    /// An idle connection: only its timeout, nginx shutting down, or the
    /// server closing it (restart, pg_terminate_backend) happen here.
    fn idle_event(&mut self, id: ConnId, readable: bool, timed_out: bool) {
        let Some(c) = self.conn(id) else { return };
        let close = c.socket.close_requested();
        if !readable && !timed_out && !close {
            return;
        }
        let gone = !timed_out && !close && (c.pg.consume_input().is_err() || c.pg.is_bad());
        if gone {
            log!(
                NGX_LOG_INFO,
                Log::cycle(),
                "sqldb: idle connection to {} closed by the server: {}",
                c.name,
                c.pg.error_message()
            );
            let addr = c.addr;
            self.forget_role(addr);
        }
        let Some(c) = self.conn(id) else { return };
        let busy = c.pg.is_busy();
        if gone {
            self.lost(id);
        }
        if timed_out || close || gone || busy {
            self.close(id);
        }
    }

    /// What a step of the connect asks for next.
    pub(super) fn connect_polled(&mut self, id: ConnId, poll: Poll, out: &mut Vec<Delivery>) {
        let Some(c) = self.conn(id) else { return };
        if matches!(poll, Poll::Reading | Poll::Writing) && c.socket_replaced() {
            // nginx watches the new one.
            if !c.follow_new_socket() {
                return self.connect_failed(id, "no free connection for the new socket (worker_connections)", out);
            }
        }
        let watched = match poll {
            Poll::Reading => c.want_write(false),
            Poll::Writing => c.want_write(true),
            Poll::Failed => {
                let msg = format!("connecting failed: {}", c.pg.error_message());
                return self.connect_failed(id, &msg, out);
            }
            Poll::Ready => {
                if c.pg.socket() != c.socket.fd() {
                    return self.connect_failed(id, "libpq replaced its socket while connecting", out);
                }
                if let Err(e) = c.pg.set_nonblocking() {
                    return self.connect_failed(id, &format!("connecting failed: {e}"), out);
                }
                c.cancel_key = c.pg.cancel_key();
                let (addr, labels) = (c.addr, [c.upstream.clone(), Rc::from(c.name.as_str())]);
                metrics::add(Id::SqldbConnects, &[&labels[0], &labels[1]], 1);
                if let Some(i) = self.lost.iter().position(|a| *a == addr) {
                    self.lost.swap_remove(i);
                    metrics::add(Id::SqldbReconnects, &[&labels[0], &labels[1]], 1);
                }
                let Some(c) = self.conn(id) else { return };
                debug!(
                    Log::cycle(),
                    "sqldb: connection #{} to {} is up (backend {})",
                    id.0.as_u64(),
                    c.name,
                    c.pg.backend_pid()
                );
                if !self.statements_off {
                    return self.check_pooler(id, out);
                }
                return self.serve_connected(id, out);
            }
        };
        if !watched {
            self.connect_failed(id, "event error", out);
        }
    }

    /// The connection is up: the requests that waited for it go out.
    fn serve_connected(&mut self, id: ConnId, out: &mut Vec<Delivery>) {
        let Some(c) = self.conn(id) else { return };
        // (A spare's connect timer, see spare.rs.)
        c.set_timer(None);
        let steps = c.pipeline.connected();
        // What the server is, before the requests that waited go out.
        self.observe_role(id, true);
        self.apply_steps(id, steps, true, out);
    }

    /// Before a new session serves, while named statements may be used:
    /// is it PostgreSQL's own? The PID a server reports when the session
    /// starts is the session's; a pooler (PgBouncer) reports one of its
    /// own making, and lends its server sessions to all its clients, who
    /// could replace a statement the gateway prepared there. One query,
    /// once per connection, before its first request.
    fn check_pooler(&mut self, id: ConnId, out: &mut Vec<Delivery>) {
        let Some(c) = self.conn(id) else { return };
        c.checking_pid = true;
        let sent =
            c.pg.send_unnamed(c"select pg_catalog.pg_backend_pid()", &[], false)
                .and_then(|()| c.flush());
        if let Err(e) = sent {
            self.connect_failed(id, &format!("connecting failed: {e}"), out);
        }
    }

    /// The answer to check_pooler's query.
    pub(super) fn pid_answer(&mut self, id: ConnId, out: &mut Vec<Delivery>) {
        let Some(c) = self.conn(id) else { return };
        if let Err(e) = c.flush() {
            return self.connect_failed(id, &format!("connecting failed: {e}"), out);
        }
        if c.pg.consume_input().is_err() || c.pg.is_bad() {
            let msg = format!("connecting failed: {}", c.pg.error_message());
            return self.connect_failed(id, &msg, out);
        }
        if c.pg.is_busy() {
            return;
        }
        // Anything but one row holding the reported PID (an error, no row,
        // another value) counts as a pooler: prepared statements stay off.
        let mut pid = None;
        let mut answers = 0;
        while let Some(res) = c.pg.get_result() {
            answers += 1;
            if res.kind() == ResultKind::Tuples && res.rows() == 1 && res.columns() == 1 {
                pid = res
                    .value(0, 0)
                    .and_then(|v| std::str::from_utf8(v).ok()?.parse::<i32>().ok());
            }
        }
        if answers != 1 {
            pid = None;
        }
        c.checking_pid = false;
        let reported = c.pg.backend_pid();
        debug!(
            Log::cycle(),
            "sqldb: connection #{} to {}: session PID {pid:?}, reported {reported}",
            id.0.as_u64(),
            c.name
        );
        c.pid_checked = pid == Some(reported);
        c.session.learn_login(c.pg.role());
        if pid != Some(reported) {
            self.pooler = true;
            self.statements_off();
        }
        self.serve_connected(id, out);
    }

    /// A connection that was up is lost: the next one to its server that
    /// opens counts as a reconnect.
    pub(super) fn lost(&mut self, id: ConnId) {
        let Some(c) = self.conn(id) else { return };
        let addr = c.addr;
        if !c.pipeline.is_connecting() && !self.lost.contains(&addr) {
            self.lost.push(addr);
        }
    }

    pub(super) fn connect_failed(&mut self, id: ConnId, msg: &str, out: &mut Vec<Delivery>) {
        self.broken(id, msg, out);
    }

    /// The connection is gone: every request on it gets its outcome, and it closes.
    pub(super) fn broken(&mut self, id: ConnId, msg: &str, out: &mut Vec<Delivery>) {
        self.lost(id);
        self.give_up(id, msg, out);
    }

    /// The gateway closes a connection it will not use (left inside a
    /// transaction, an unsafe encoding): its requests get their outcome.
    fn give_up(&mut self, id: ConnId, msg: &str, out: &mut Vec<Delivery>) {
        self.end_gone_query(id, msg);
        let Some(c) = self.conn(id) else { return };
        debug!(
            Log::cycle(),
            "sqldb: connection #{} to {} lost: {msg}",
            id.0.as_u64(),
            c.name
        );
        for (req, lost) in c.pipeline.lost() {
            c.forget(req);
            out.push(Delivery::Failed(req, lost, msg.to_owned()));
        }
        let addr = c.addr;
        self.forget_role(addr);
        self.close(id);
    }

    /// Reads every result that has arrived and hands each its request.
    pub(super) fn read_results(&mut self, id: ConnId, out: &mut Vec<Delivery>) {
        let sink = self.sink;
        let long = self.settings.long();
        let Some(c) = self.conn(id) else { return };
        let front = c.front_template();
        let mut again = Vec::new();
        let mut gone_preambles = Vec::new();
        // Why the connection is going away, when the server said so.
        let mut lost: Option<String> = None;
        // A request's sync point was read: the session is up to date
        // (a change of role comes before it).
        let mut synced = false;
        // Only while queries are in flight: past the last one's results
        // libpq has nothing more (a result then would be no query's; the
        // idle connection's read event sees to what the server sends).
        while !c.pipeline.is_paused() && !c.pipeline.nothing_in_flight() {
            if c.pipeline.wants_single_row() {
                c.pg.set_single_row_mode();
            }
            if c.pg.is_busy() {
                break;
            }
            let res = c.pg.get_result();
            let kind = match &res {
                None if c.pg.is_bad() => {
                    lost.get_or_insert_with(|| c.pg.error_message());
                    break;
                }
                None => gateway_core::pipeline::ResultKind::End,
                Some(r) => r.route_kind(),
            };
            synced |= kind == gateway_core::pipeline::ResultKind::Sync;
            let (route, steps) = c.pipeline.on_result(kind);
            if kind != gateway_core::pipeline::ResultKind::Row {
                debug!(
                    Log::cycle(),
                    "sqldb: connection #{}: {kind:?} routed: {route:?}",
                    id.0.as_u64()
                );
            }
            match (route, res) {
                (Route::Row(req), Some(res)) => {
                    let verdict = sink.map_or(RowVerdict::Continue, |s| s.row(req, &res));
                    if verdict == RowVerdict::Pause {
                        c.pipeline.pause();
                        if !c.pause_reading(true) {
                            lost = Some("event error".into());
                        }
                    }
                }
                (Route::Result(req), Some(res)) => out.push(Delivery::Result(req, res)),
                (Route::Error(req), Some(res)) => {
                    c.session.settled(req, false);
                    out.push(Delivery::Error(req, res));
                }
                (Route::PreambleError(req), Some(res)) => {
                    c.session.settled(req, false);
                    out.push(Delivery::PreambleFailed(req, res));
                }
                (Route::Refused(req), res) => {
                    let status = res.map_or_else(String::new, |r| r.status_name());
                    c.forget(req);
                    out.push(Delivery::Refused(
                        req,
                        format!("the query started a COPY ({status}), which the gateway cannot serve"),
                    ));
                    return self.broken(id, "COPY is not supported", out);
                }
                (Route::SessionEnding, res) => {
                    lost = Some(res.map_or_else(String::new, |r| r.error_summary()));
                }
                (Route::Confused, _) => {
                    lost = Some("unexpected results".into());
                    break;
                }
                _ => {}
            }
            match steps {
                None => {}
                Some(Step::Complete(req)) => {
                    c.forget(req);
                    c.session.settled(req, true);
                    out.push(Delivery::Complete(req));
                }
                Some(Step::Resend(req)) => {
                    // Its statement vanished (DEALLOCATE ALL or DISCARD
                    // ALL, in a function say): the preambles did too
                    // (conn.rs). With the session keeping the role, the
                    // next to be sent may come long after: a query
                    // statement prepared again meanwhile must not be
                    // taken for another's then.
                    gone_preambles.extend(c.preambles_vanished(req));
                    again.push((req, false));
                }
                Some(Step::Deallocate(req)) => again.push((req, true)),
                Some(other) => debug_assert!(false, "a result step {other:?}"),
            }
        }
        c.progressed(front, long);
        // A read-only default that a query set itself (session.rs).
        c.session.observe(|| c.pg.role());
        if c.pipeline.take_preamble_vanished() {
            // Dropped behind the gateway's back (DISCARD ALL): prepared again.
            c.preambles.clear();
        }
        if c.pipeline.take_shared_session() {
            let name = c.name.clone();
            self.statements_shared(&name);
        }
        // A change of role comes just before the end of a query's results.
        self.observe_role(id, synced);
        let Some(c) = self.conn(id) else { return };
        // The end of the session may be announced (a FATAL message) before
        // it is here: then the next read event finds it.
        let gone = c.pg.is_bad() || (lost.is_some() && (c.pg.consume_input().is_err() || c.pg.is_bad()));
        if gone {
            let why = lost.unwrap_or_else(|| c.pg.error_message());
            return self.broken(id, &format!("connection lost: {why}"), out);
        }
        // Prepared statements that vanished (DEALLOCATE, DISCARD) or whose
        // plan changed (deallocated first): prepared again, the requests
        // sent again (they did not run), in the order the routing asked.
        // Preambles that may have vanished with them: deallocated first.
        if let Err(e) = c.deallocate_preambles(gone_preambles) {
            return self.broken(id, &format!("sending DEALLOCATE failed: {e}"), out);
        }
        for (req, deallocate) in again {
            let sent = if deallocate {
                debug!(
                    Log::cycle(),
                    "sqldb: connection #{}: a changed plan is deallocated",
                    id.0.as_u64()
                );
                c.deallocate(req)
            } else {
                let Some(q) = c.query_of(req) else { continue };
                c.send(req, &q)
            };
            if let Err(e) = sent {
                return self.broken(id, &format!("sending the query failed: {e}"), out);
            }
        }
        let steps = c.pipeline.after_results();
        self.apply(id, steps, out);
    }

    /// A prepared statement vanished or was there already, with nothing of
    /// this connection's to explain it: the server's sessions are shared
    /// (PgBouncer in transaction mode, say). Named statements could run
    /// another client's statement of the same name: they are off for this
    /// upstream in this worker; requests that met it go again, unnamed.
    fn statements_shared(&mut self, name: &str) {
        if !self.statements_off {
            log!(
                NGX_LOG_WARN,
                Log::cycle(),
                "sqldb: the sessions behind {name} are shared (a pooler in transaction mode?): \
                 prepared statements are off for this upstream; set \"sqldb_prepare off\""
            );
        }
        self.statements_off();
    }

    /// No named statements on this upstream in this worker, from now on.
    fn statements_off(&mut self) {
        self.statements_off = true;
        for (_, c) in self.conns.iter_mut() {
            c.unnamed = true;
        }
    }

    /// Carries out what the routing asks.
    pub(super) fn apply(&mut self, id: ConnId, steps: Steps<super::ReqToken>, out: &mut Vec<Delivery>) {
        self.apply_steps(id, steps, false, out)
    }

    /// `connected`: the connection has just come up (the requests that
    /// waited on it report their connect time).
    fn apply_steps(&mut self, id: ConnId, steps: Steps<super::ReqToken>, connected: bool, out: &mut Vec<Delivery>) {
        // (A prefer-standby request whose server turned out a primary while
        // another server's role is still to be learned goes there first.)
        let standby_hope = self.standby_hope();
        // Requests that waited and went elsewhere (their server does not
        // meet their target): those behind them go out, or it settles.
        let mut withdrawn = false;
        for step in steps {
            let Some(c) = self.conn(id) else { return };
            match step {
                Step::Complete(req) => {
                    c.forget(req);
                    c.session.settled(req, true);
                    out.push(Delivery::Complete(req));
                }
                Step::Deallocate(req) => {
                    if let Err(e) = c.deallocate(req) {
                        return self.broken(id, &format!("sending the query failed: {e}"), out);
                    }
                }
                Step::Resend(req) => {
                    if let Some(q) = c.query_of(req) {
                        if let Err(e) = c.send(req, &q) {
                            return self.broken(id, &format!("sending the query failed: {e}"), out);
                        }
                    }
                }
                Step::Send(reqs) => {
                    // Requests that waited go out on a connection with
                    // nothing in flight: never into a transaction an
                    // earlier request left open (they would run inside it,
                    // and be rolled back when the connection closes). They
                    // were not sent: each tries again elsewhere.
                    // Nor into a session whose client encoding makes escaped
                    // values unsafe.
                    let unfit = if !connected && !c.reusable() {
                        Some("the connection was left inside a transaction block".to_owned())
                    } else {
                        c.check_encoding().err().map(|e| e.0)
                    };
                    if let Some(why) = unfit {
                        log!(
                            NGX_LOG_INFO,
                            Log::cycle(),
                            "sqldb: connection to {} closes: {why}; {} request(s) that waited on it move to another connection",
                            c.name,
                            reqs.len()
                        );
                        for &req in &reqs {
                            c.forget(req);
                            out.push(Delivery::Failed(
                                req,
                                gateway_core::pipeline::Lost::NotSent,
                                why.clone(),
                            ));
                        }
                        // Closed by choice, not lost: no reconnect to count.
                        return self.give_up(id, &why, out);
                    }
                    c.set_timer(None);
                    for req in reqs {
                        let Some(q) = c.query_of(req) else { continue };
                        let target = q.target.get();
                        if !target.is_any() {
                            let role = c.server_role();
                            if !target.meets(role, standby_hope) {
                                c.forget(req);
                                c.pipeline.withdraw(req);
                                withdrawn = true;
                                out.push(Delivery::Unfit(req, format!("{} is {}", c.name, role.describe())));
                                continue;
                            }
                        }
                        let sent = c.send(req, &q);
                        out.push(Delivery::Started(req, connected));
                        if let Err(e) = sent {
                            return self.broken(id, &format!("sending the query failed: {e}"), out);
                        }
                    }
                }
                Step::Cancel => self.cancel(id, out),
                Step::CancelLater(ms) => c.cancel_later(ms as ngx_msec_t, Some(cancel_again_event)),
                Step::DrainTimer => c.set_timer(Some(DRAIN_TIMEOUT)),
                Step::Settle => {
                    c.set_timer(None);
                    self.settle(id);
                }
                Step::Resume => {
                    if !c.pause_reading(false) {
                        return self.broken(id, "event error", out);
                    }
                }
                Step::Close => self.close(id),
            }
        }
        if withdrawn {
            let Some(c) = self.conn(id) else { return };
            let more = c.pipeline.resume_waiting();
            self.apply_steps(id, more, connected, out);
        }
    }

    /// A connection closes while a query of a request that is gone still
    /// runs on it (its cancel requests did not end it in time, or the
    /// gateway gives the connection up): closing the socket would not stop
    /// the backend, which would run the query to its end, unseen. It is
    /// ended from a session of its own (`pg_terminate_backend`, which the
    /// login role may call on its own backends) when its PID is known to be
    /// the server's; behind a pooler it is not (the PID is the pooler's
    /// making, and could be another session's on the server).
    fn end_gone_query(&mut self, id: ConnId, why: &str) {
        let pool = NonNull::from(&mut *self);
        let key = self.terminators.next_key();
        let Some(c) = self.conn(id) else { return };
        if !c.pipeline.gone_query_runs() || c.pg.is_bad() {
            return;
        }
        let pid = c.pg.backend_pid();
        if !c.pid_checked {
            log!(
                NGX_LOG_WARN,
                Log::cycle(),
                "sqldb: a query of a request that is gone may run on behind {} (backend {pid} as reported) after its connection closes ({why}): \
                 it cannot be ended, as that PID is not known to be the server's (a pooler between?)",
                c.name
            );
            return;
        }
        let name = c.name.clone();
        match Terminator::start(&c.conninfo, pid, name.clone(), (pool, key), Some(terminate_event)) {
            Ok(t) => {
                log!(
                    NGX_LOG_INFO,
                    Log::cycle(),
                    "sqldb: ending backend {pid} on {name}: it still runs a query of a request that is gone, and its connection closes ({why})"
                );
                let mut t = Box::new(t);
                let data: *mut Terminator = &mut *t;
                t.set_data(data.cast());
                let got = self.terminators.insert(t);
                debug_assert_eq!(got, key);
            }
            Err(e) => log!(
                NGX_LOG_WARN,
                Log::cycle(),
                "sqldb: backend {pid} on {name} runs on with a query of a request that is gone: it could not be ended: {e}"
            ),
        }
    }

    /// An event of a session that ends a backend.
    fn on_terminate_event(&mut self, key: gateway_core::slab::Key, timed_out: bool) {
        let Some(t) = self.terminators.get_mut(key) else { return };
        let ending = t.on_event(timed_out);
        let (pid, name) = (t.pid, &t.name);
        match ending {
            Ending::Pending => return,
            Ending::Ended => log!(
                NGX_LOG_INFO,
                Log::cycle(),
                "sqldb: backend {pid} on {name} was ended (pg_terminate_backend)"
            ),
            Ending::Gone => log!(
                NGX_LOG_INFO,
                Log::cycle(),
                "sqldb: backend {pid} on {name} had ended already"
            ),
            Ending::Failed(why) => log!(
                NGX_LOG_WARN,
                Log::cycle(),
                "sqldb: backend {pid} on {name} runs on with a query of a request that is gone: it could not be ended: {why}"
            ),
        }
        if let Some(t) = self.terminators.remove(key) {
            t.close();
        }
    }

    /// The queries of requests that are gone did not end in time: the
    /// connection goes; requests that waited on it try again.
    fn drain_expired(&mut self, id: ConnId, out: &mut Vec<Delivery>) {
        let Some(c) = self.conn(id) else { return };
        log!(
            NGX_LOG_WARN,
            Log::cycle(),
            "sqldb: queries of requests that are gone did not end within {DRAIN_TIMEOUT} ms on {} (backend {}): closing the connection",
            c.name,
            c.pg.backend_pid()
        );
        self.broken(id, "the connection was closed: cancelled queries did not end", out);
    }
}
