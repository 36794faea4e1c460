//! The drain: every request of a connection has left while its queries
//! still run. What runs is cancelled (cancel requests, sent again after a
//! pause while the same query runs on), and the connection serves again
//! once its queue is empty.

use super::{Phase, Pipeline, Step, Steps, CANCEL_AGAIN_FIRST, CANCEL_AGAIN_MAX};

impl<T: Copy + Eq> Pipeline<T> {
    /// Queries run, yet no request is there for them (nor one to be sent
    /// again, nor a DEALLOCATE of the gateway's, which must not be
    /// cancelled: the session would keep a statement it was told is gone).
    /// (Requests waiting to be sent do not keep a gone one's query
    /// running: they go once it is cancelled.)
    pub(super) fn drainable(&self) -> bool {
        !self.queue.is_empty() && self.queue.iter().all(|e| e.req.is_none() && !e.internal) && self.resending.is_empty()
    }

    /// Every request left: cancel what runs, or close a connection still
    /// connecting, or let an idle one settle.
    pub(super) fn begin_drain(&mut self) -> Steps<T> {
        let starting = !self.draining;
        self.draining = true;
        let steps = self.cancel_running();
        if starting && steps.is_empty() {
            return Steps::one(Step::DrainTimer);
        }
        steps
    }

    /// One cancel request per query that runs (the head's), one at a time.
    /// Each query cancelled has the drain's time to end: the timer starts
    /// again with each, so that a line of them ending in turn is not cut
    /// off (closing the connection would leave the query that runs then
    /// running on the server to its end). Sending it again (`cancel_again`)
    /// does not start the drain's time again.
    pub(super) fn cancel_running(&mut self) -> Steps<T> {
        let Some(head) = self.queue.front().filter(|e| !e.internal).map(|e| e.seq) else {
            return Steps::new();
        };
        if !self.draining || self.cancel_in_flight || self.cancels_off || self.cancelled_seq == Some(head) {
            return Steps::new();
        }
        self.cancelled_seq = Some(head);
        self.cancel_tries = 1;
        self.cancel_again_due = false;
        self.cancel_in_flight = true;
        let mut steps = Steps::one(Step::DrainTimer);
        steps.push(Step::Cancel);
        steps
    }

    /// The query at the head is the one the last cancel request was for.
    pub(super) fn head_cancelled(&self) -> bool {
        !self.cancels_off
            && self
                .queue
                .front()
                .is_some_and(|e| !e.internal && e.req.is_none() && Some(e.seq) == self.cancelled_seq)
    }

    /// How long to wait before the next cancel request for the same query.
    pub(super) fn cancel_pause(&self) -> u64 {
        let doublings = self.cancel_tries.saturating_sub(1).min(16);
        CANCEL_AGAIN_FIRST.saturating_mul(1 << doublings).min(CANCEL_AGAIN_MAX)
    }

    pub(super) fn finish_drain(&mut self) -> Steps<T> {
        self.draining = false;
        self.cancel_again_due = false;
        self.cancels_off = false;
        self.send_waiting()
    }

    /// A cancel request is through (or failed): the next query that runs may
    /// need one; the same one, still running, gets another after a pause
    /// (`Step::CancelLater`); a drained connection serves again.
    pub fn cancel_done(&mut self) -> Steps<T> {
        self.cancel_in_flight = false;
        if self.phase != Phase::Ready || !self.draining {
            return Steps::new();
        }
        if self.queue.is_empty() {
            return self.finish_drain();
        }
        let steps = self.cancel_running();
        if !steps.is_empty() || !self.head_cancelled() {
            return steps;
        }
        self.cancel_again_due = true;
        Steps::one(Step::CancelLater(self.cancel_pause()))
    }

    /// The `CancelLater` timer fired: another cancel request for the query,
    /// if it still runs (one that ended since needs none; the next one
    /// running, if not cancelled yet, gets its first).
    pub fn cancel_again(&mut self) -> Steps<T> {
        let due = std::mem::take(&mut self.cancel_again_due);
        if !due || self.phase != Phase::Ready || !self.draining || self.cancel_in_flight {
            return Steps::new();
        }
        if !self.head_cancelled() {
            return self.cancel_running();
        }
        self.cancel_tries = self.cancel_tries.saturating_add(1);
        self.cancel_in_flight = true;
        Steps::one(Step::Cancel)
    }

    /// Cancel requests sent for the query being cancelled (0: none).
    pub fn cancel_tries(&self) -> u32 {
        if self.head_cancelled() {
            self.cancel_tries
        } else {
            0
        }
    }

    /// Cancel requests cannot be sent (the session has no key): no more are
    /// tried until the connection has drained.
    pub fn cancel_unavailable(&mut self) {
        self.cancel_in_flight = false;
        self.cancel_again_due = false;
        self.cancels_off = true;
    }

    /// A query of a request that is gone runs (the connection drains):
    /// closing the connection now would leave it running on the server.
    pub fn gone_query_runs(&self) -> bool {
        self.phase == Phase::Ready
            && self.draining
            && self.queue.front().is_some_and(|e| e.req.is_none() && !e.internal)
    }
}
