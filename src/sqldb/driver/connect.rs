//! Making a database connection: libpq's nonblocking connect, one step
//! (PQconnectPoll) at a time as the socket is ready. The steps that may
//! cost milliseconds of CPU run on a thread of nginx's pool when there is
//! one (ffi::thread): those that read the server's authentication requests
//! (the answer to a SCRAM challenge computes the password's proof) and
//! those of a TLS handshake; they would hold up every other request of
//! the worker. The others run in place. What a step asks for next is
//! events.rs's `connect_polled`.

use std::cell::RefCell;
use std::ptr::NonNull;

use super::pq::{PgConn, Poll, PollHandle};
use super::{deliver, ConnId, ConnPool, Delivery};
use crate::debug;
use crate::ffi::{fault_setting, thread, Log};

/// A step of the connect, for a thread.
pub(super) struct ConnectStep {
    pg: PollHandle,
    pool: NonNull<ConnPool>,
    id: ConnId,
    poll: Poll,
    /// Fault injection only (NGX_GATEWAY_SLOW_CONNECT_STEP=<ms>): the step
    /// takes that much longer on its thread.
    delay_ms: u64,
}

// SAFETY: the step crosses to one of nginx's threads and back
// (thread::post): there `run` uses only the session's handle, which nothing
// else uses while the connection's `polling` is set (ConnPool::close leaves
// the session to connect_stepped when it closes the connection meanwhile);
// the pool is reached only back in the event loop (connect_stepped).
unsafe impl Send for ConnectStep {}

impl ConnectStep {
    fn run(&mut self) {
        if self.delay_ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(self.delay_ms));
        }
        self.poll = self.pg.poll_connect();
    }
}

thread_local! {
    /// Sessions of connections closed while a step of their connect ran
    /// on a thread: finished when the step is back.
    static ORPHANS: RefCell<Vec<PgConn>> = const { RefCell::new(Vec::new()) };
}

/// A connection closes while a step of its connect runs on a thread: its
/// session is finished once the step is back (connect_step_done).
pub(super) fn orphan(pg: PgConn) {
    ORPHANS.with(|o| o.borrow_mut().push(pg));
}

/// Back in the event loop, from the thread.
fn connect_stepped(step: ConnectStep) {
    let (pool, id) = (step.pool, step.id);
    let done = |pool: &mut ConnPool| {
        let mut out = Vec::new();
        pool.connect_step_done(step, &mut out);
        pool.show(id);
        (pool.sink, out)
    };
    // SAFETY: a pool is the worker's (worker) until the worker ends.
    let (sink, out) = unsafe { super::worker::lend(pool, done) };
    deliver(sink, out);
}

impl ConnPool {
    /// PQconnectPoll until the session is up (a costly step on a thread);
    /// then the requests that waited go out.
    pub(super) fn connecting(&mut self, id: ConnId, out: &mut Vec<Delivery>) {
        let pool = NonNull::from(&mut *self);
        let Some(c) = self.conn(id) else { return };
        if c.checking_pid {
            return self.pid_answer(id, out);
        }
        if c.polling {
            c.poll_again = true;
            return;
        }
        if !c.pg.connect_step_is_heavy() && fault_setting("NGX_GATEWAY_SLOW_CONNECT_STEP").is_none() {
            // (A cheap step: in place, without a round trip to a thread.)
            let poll = c.pg.poll_connect();
            return self.connect_polled(id, poll, out);
        }
        let step = ConnectStep {
            pg: c.pg.poll_handle(),
            pool,
            id,
            poll: Poll::Failed,
            delay_ms: fault_setting("NGX_GATEWAY_SLOW_CONNECT_STEP")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
        };
        // While the step runs on its thread the socket is the thread's:
        // nginx watches nothing of it (its events are level-triggered, so
        // a writable or readable socket would wake the worker at every turn
        // until the step is back), and the step's result says what to
        // watch next.
        if !c.pause_reading(true) || !c.want_write(false) {
            let out_of_watch = "cannot stop watching the connection while a step of its connect runs";
            return self.connect_failed(id, out_of_watch, out);
        }
        match thread::post(step, ConnectStep::run, connect_stepped) {
            Ok(()) => {
                c.polling = true;
                debug!(
                    Log::cycle(),
                    "sqldb: a step of connection #{}'s connect runs on a thread",
                    id.0.as_u64()
                );
            }
            Err(mut step) => {
                step.run();
                self.step_back(id, step.poll, out);
            }
        }
    }

    /// A step of the connect is done: the socket is watched again (a
    /// socket that libpq made in place of the old one during the step is
    /// watched from the start by connect_polled).
    fn step_back(&mut self, id: ConnId, poll: Poll, out: &mut Vec<Delivery>) {
        let Some(c) = self.conn(id) else { return };
        if !c.socket_replaced() && !c.pause_reading(false) {
            return self.connect_failed(id, "cannot watch the connection", out);
        }
        self.connect_polled(id, poll, out);
    }

    /// A step of the connect came back from its thread.
    fn connect_step_done(&mut self, step: ConnectStep, out: &mut Vec<Delivery>) {
        let Some(c) = self.conn(step.id).filter(|c| c.pg.poll_handle() == step.pg) else {
            // Closed meanwhile: the session is finished now.
            debug!(
                Log::cycle(),
                "sqldb: connection #{} closed while a step of its connect ran on a thread: its session ends now",
                step.id.0.as_u64()
            );
            ORPHANS.with(|o| o.borrow_mut().retain(|pg| pg.poll_handle() != step.pg));
            return;
        };
        c.polling = false;
        let again = std::mem::take(&mut c.poll_again);
        self.step_back(step.id, step.poll, out);
        // The connection's timer came while the step ran: step again.
        // (Its socket is not watched meanwhile; watched again, its
        // readiness comes as an event of its own.)
        if again
            && self
                .conn(step.id)
                .is_some_and(|c| c.pipeline.is_connecting() && !c.checking_pid)
        {
            self.connecting(step.id, out);
        }
    }
}
