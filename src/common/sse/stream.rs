//! The subscribers' side of `cache_stream`: the entries of a Redis stream
//! as events with their own ids and names. The reader (the cache driver's
//! stream hub) knows subscribers by token only; it tells this side what it
//! read, live for every subscriber of a key or as one subscriber's
//! catch-up after its `Last-Event-ID`.

use std::rc::Rc;

use gateway_core::metrics::Id;
use gateway_core::sse;
use gateway_core::streams::Entry;

use super::{Fanout, SUBSCRIBED};
use crate::common::token::ReqToken;
use crate::ffi::*;
use crate::metrics;

/// Where a stream reader's entries go (the request side).
pub trait StreamSink {
    /// The key is read now for these subscribers (`: subscribed`).
    fn subscribed(&self, to: &[ReqToken]);
    /// Live entries of a key, in order, for its subscribers.
    fn entries(&self, to: &[ReqToken], entries: &[Entry]);
    /// One page of a subscriber's catch-up, in order.
    fn replayed(&self, who: ReqToken, entries: &[Entry]);
    /// A round of a catch-up begins: held live entries let go from now on
    /// are counted (`lapsed`).
    fn begin_round(&self, who: ReqToken);
    /// Held live entries were let go since the round began.
    fn lapsed(&self, who: ReqToken) -> bool;
    /// The catch-up is over: held live entries above it go out, and live
    /// ones flow (the response header first, where it waited).
    fn release(&self, who: ReqToken);
    /// The bytes waiting for the subscriber (None: it is gone, or was
    /// dropped now for being too far behind).
    fn backlog(&self, who: ReqToken) -> Option<usize>;
    /// These subscriptions end: `status` for those whose response header
    /// has not gone out, the end of the stream for the others.
    fn fail(&self, to: &[ReqToken], status: ngx_int_t);
    /// nginx is exiting (or the password was refused): the streams end.
    fn closing(&self, to: &[ReqToken]);
    /// The servers cannot be reached (once per outage; hub::Outage).
    fn unavailable(&self, to: &[ReqToken]);
}

/// Each entry's id and bytes, shared by every subscriber.
fn events(entries: &[Entry]) -> Vec<(Vec<u8>, Rc<[u8]>)> {
    entries
        .iter()
        .map(|e| {
            let id = e.id.to_string().into_bytes();
            let bytes = Rc::from(sse::entry_event(&id, e.event.as_deref(), &e.data));
            (id, bytes)
        })
        .collect()
}

impl StreamSink for Fanout {
    fn subscribed(&self, to: &[ReqToken]) {
        self.write_all(to, SUBSCRIBED);
    }

    fn entries(&self, to: &[ReqToken], entries: &[Entry]) {
        let sent = self.id_events(to, &events(entries), true);
        metrics::add(Id::EventsSent, &[self.source], sent);
    }

    fn replayed(&self, who: ReqToken, entries: &[Entry]) {
        let sent = self.id_events(&[who], &events(entries), false);
        metrics::add(Id::EventsSent, &[self.source], sent);
        // The response header goes with the first page: what waits behind
        // it flows from now on (a catch-up that pauses for a subscriber
        // with much waiting must see it taken).
        self.open(&[who]);
    }

    fn begin_round(&self, who: ReqToken) {
        Fanout::begin_round(self, &[who]);
    }

    fn lapsed(&self, who: ReqToken) -> bool {
        Fanout::lapsed(self, &[who])
    }

    fn release(&self, who: ReqToken) {
        Fanout::release(self, &[who]);
    }

    fn backlog(&self, who: ReqToken) -> Option<usize> {
        let most = Fanout::backlog(self, &[who]);
        (!self.live(&[who]).is_empty()).then_some(most)
    }

    fn fail(&self, to: &[ReqToken], status: ngx_int_t) {
        Fanout::fail(self, to, status);
    }

    fn closing(&self, to: &[ReqToken]) {
        <Fanout as crate::common::hub::HubSink>::closing(self, to);
    }

    fn unavailable(&self, to: &[ReqToken]) {
        <Fanout as crate::common::hub::HubSink>::unavailable(self, to);
    }
}
