//! The pool's side of cancel requests: a query of a request that is gone
//! is cancelled from a connection of its own (cancel.rs), again after a
//! pause while it still runs (core::pipeline decides when).

use gateway_core::metrics::Id;

use super::cancel::{Canceller, Progress};
use super::conn::Conn;
use super::pq::CancelKey;
use super::{deliver, with_owner, worker, ConnId, ConnPool, Delivery};
use crate::ffi::*;
use crate::{log, metrics};

/// How long a cancel request may take.
const CANCEL_TIMEOUT: ngx_msec_t = 5_000;

event_handler! {
    /// Events of a cancel request's connection.
    fn cancel_event(ev) = "sqldb cancel event", {
        let timed_out = ev.take_timedout();
        let step = |pool: &mut ConnPool, id| {
            let mut out = Vec::new();
            pool.on_cancel_event(id, timed_out, &mut out);
            pool.show(id);
            (pool.sink, out)
        };
        // SAFETY: the cancel connection's data is the Conn that owns it.
        let (sink, out) = unsafe { with_owner(&ev, step) };
        deliver(sink, out);
    }
}

event_handler! {
    /// The pause after a cancel request is over: another one, if the query
    /// still runs.
    pub(super) fn cancel_again_event(ev) = "sqldb cancel timer", {
        // SAFETY: the timer's data is its live, boxed Conn (the timer is
        // dropped with it).
        let (pool, id) = unsafe {
            let conn = &*(ev.data() as *const Conn);
            (conn.pool, conn.id)
        };
        ev.take_timedout();
        let step = |pool: &mut ConnPool| {
            let mut out = Vec::new();
            if let Some(c) = pool.conn(id) {
                let steps = c.pipeline.cancel_again();
                pool.apply(id, steps, &mut out);
            }
            pool.show(id);
            (pool.sink, out)
        };
        // SAFETY: a Conn's pool is the worker's pool that owns it (worker).
        let (sink, out) = unsafe { worker::lend(pool, step) };
        deliver(sink, out);
    }
}

impl ConnPool {
    /// Sends a cancel request for the query running now (one of a request
    /// that is gone).
    pub(super) fn cancel(&mut self, id: ConnId, out: &mut Vec<Delivery>) {
        let Some(c) = self.conn(id) else { return };
        let pid = c.pg.backend_pid();
        let Some(key) = c.cancel_key.clone() else {
            log!(
                NGX_LOG_INFO,
                Log::cycle(),
                "sqldb: a query of a request that is gone runs on {} (backend {pid}); it cannot be cancelled, its results are read and dropped",
                c.name
            );
            c.pipeline.cancel_unavailable();
            return;
        };
        // Fault injection (NGX_GATEWAY_LOSE_CANCELS): a key the server does
        // not know, so that it drops every cancel request.
        let key = match fault_setting("NGX_GATEWAY_LOSE_CANCELS") {
            Some(_) => CancelKey {
                key: key.key ^ 0x5a5a_5a5a,
                ..key
            },
            None => key,
        };
        let tries = c.pipeline.cancel_tries();
        let data: *mut Conn = c;
        match Canceller::start(&key, Some(cancel_event), data.cast()) {
            Ok(canceller) => {
                metrics::add(Id::SqldbCancels, &[&c.upstream], 1);
                if tries > 1 {
                    log!(
                        NGX_LOG_INFO,
                        Log::cycle(),
                        "sqldb: the query of a request that is gone still runs on {} (backend {pid}): cancel request {tries} sent",
                        c.name
                    );
                } else {
                    log!(
                        NGX_LOG_INFO,
                        Log::cycle(),
                        "sqldb: cancelling the query of a request that is gone on {} (backend {pid})",
                        c.name
                    );
                }
                canceller.set_timer(CANCEL_TIMEOUT);
                c.canceller = Some(canceller);
            }
            Err(e) => {
                log!(
                    NGX_LOG_WARN,
                    Log::cycle(),
                    "sqldb: cancel request to {} (backend {pid}) failed: {e}",
                    c.name
                );
                // Tried again after a pause, as one that was dropped.
                let steps = c.pipeline.cancel_done();
                self.apply(id, steps, out);
            }
        }
    }

    fn on_cancel_event(&mut self, id: ConnId, timed_out: bool, out: &mut Vec<Delivery>) {
        let Some(c) = self.conn(id) else { return };
        let Some(canceller) = c.canceller.as_mut() else { return };
        match canceller.on_event(timed_out) {
            Progress::Pending => return,
            Progress::Done => {}
            Progress::Failed(why) => log!(
                NGX_LOG_WARN,
                Log::cycle(),
                "sqldb: cancel request to {} (backend {}) failed: {why}",
                c.name,
                c.pg.backend_pid()
            ),
        }
        if let Some(canceller) = c.canceller.take() {
            canceller.close();
        }
        // Fault injection: a query held back until now goes out (after the
        // cancel request, which its backend, idle, dropped).
        if let Err(e) = c.release_held() {
            return self.broken(id, &format!("sending to PostgreSQL failed: {e}"), out);
        }
        let steps = c.pipeline.cancel_done();
        self.apply(id, steps, out);
    }
}
