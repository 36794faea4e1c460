//! Events with ids, for subscriptions that resume: the payload's first
//! word is the event's id (`id:`), the rest its data. A subscriber is never
//! sent an id that is not above the last one it was sent, so an event that
//! comes twice (replayed, then live) goes out once. While its gateway
//! replays the events after its last id (a client that came back with
//! `Last-Event-ID`, a connection made again), its live events are held, and
//! released after the replayed ones: those above the last replayed id go
//! out, in order.

use std::rc::Rc;

use gateway_core::sse;

use gateway_core::metrics::Id;

use super::{end, open_header, send, too_far_behind, Fanout};
use crate::common::token::{self, ReqToken};
use crate::ffi::*;
use crate::{log, metrics};

/// Live events held for one subscriber while a replay runs, at most this
/// many bytes (per subscriber). Past it they are let go and the replay
/// runs one more round, which finds them in its table.
pub const HELD_MAX: usize = 1 << 20;

/// How a subscription resumes.
pub struct Resume {
    /// The client's last id (`Last-Event-ID`): events up to it are not
    /// sent, live ones are held until the replay is over, and the response
    /// header waits for its first replayed events (`Fanout::open`).
    pub from: Option<Vec<u8>>,
    /// What the gateway knows the subscription by (its location).
    pub tag: usize,
    /// The ids a live event's first word may be (sse::IdKind): another
    /// first word is no id, and the event goes without one.
    pub kind: sse::IdKind,
}

/// A subscription's ids.
pub(super) struct Ids {
    last: Option<Vec<u8>>,
    held: Option<Held>,
    tag: usize,
    kind: sse::IdKind,
}

/// A held event: its id (if it has one) and its bytes, as every
/// subscriber that holds it shares them.
type HeldEvent = (Option<Vec<u8>>, Rc<[u8]>);

/// Live events held while a replay runs.
#[derive(Default)]
struct Held {
    events: Vec<HeldEvent>,
    bytes: usize,
    /// Events were let go (past HELD_MAX) since the replay's round began.
    lapsed: bool,
}

impl Held {
    fn push(&mut self, id: Option<&[u8]>, bytes: Rc<[u8]>) {
        if self.bytes + bytes.len() > HELD_MAX {
            self.events = Vec::new();
            self.bytes = 0;
            self.lapsed = true;
        }
        self.bytes += bytes.len();
        self.events.push((id.map(<[u8]>::to_vec), bytes));
    }
}

impl Ids {
    pub(super) fn new(r: Resume) -> Ids {
        let held = r.from.is_some().then(Held::default);
        Ids {
            last: r.from,
            held,
            tag: r.tag,
            kind: r.kind,
        }
    }

    pub(super) fn holding(&self) -> bool {
        self.held.is_some()
    }
}

/// What a replay needs to know of a subscription.
pub struct SubState {
    pub channel: String,
    pub tag: usize,
    /// The last id it was sent (or came with).
    pub last: Option<Vec<u8>>,
    /// A replay holds its live events.
    pub holding: bool,
}

impl Fanout {
    /// A live event to each subscriber of `to`: as it is to those without
    /// ids; to the others with its id, unless they were sent one as high,
    /// held while their replay runs. How many were sent it.
    ///
    /// A first word that is no id of a subscriber's kind (a notification
    /// its replay did not send: any session may notify a channel) is no
    /// id for it: the event goes as it is, without `id:`, and does not
    /// become its last id (which it would send back when it comes back,
    /// for the replay to refuse, and which would hold back the real ids
    /// below it). One warn line says so, for all the subscribers.
    pub(super) fn live_event(&self, to: &[ReqToken], channel: &str, payload: &[u8]) -> i64 {
        let plain: Rc<[u8]> = Rc::from(sse::event(channel, payload));
        let (word, data) = sse::split_id(payload);
        let mut with_id: Option<Rc<[u8]>> = None;
        let mut sent = 0;
        let mut refused = None;
        self.each(to, |sub| {
            let id = match (word, sub.ids.as_ref()) {
                (Some(w), Some(ids)) if !ids.kind.takes(w) => {
                    refused = Some(ids.kind);
                    None
                }
                _ => word,
            };
            let bytes = match (sub.ids.as_mut(), id) {
                (None, _) => plain.clone(),
                (Some(ids), Some(id)) => {
                    if !sse::is_after(id, ids.last.as_deref()) {
                        return;
                    }
                    let b = with_id.get_or_insert_with(|| Rc::from(sse::event_with_id(id, channel, data)));
                    b.clone()
                }
                // (No id: it goes as it is.)
                (Some(_), None) => plain.clone(),
            };
            if let Some(ids) = sub.ids.as_mut() {
                if let Some(held) = ids.held.as_mut() {
                    return held.push(id, bytes);
                }
                if let Some(id) = id {
                    ids.last = Some(id.to_vec());
                }
            }
            sent += i64::from(self.put(sub, &bytes));
        });
        self.shed();
        if let (Some(kind), Some(w)) = (refused, word) {
            log!(
                NGX_LOG_WARN,
                Log::cycle(),
                "{}: a notification on channel \"{}\" starts with \"{}\", which is no id of its replay ({kind}): it goes as an event without an id (only the outbox's trigger should notify a replaying channel)",
                self.gateway,
                channel.escape_default(),
                w.escape_ascii()
            );
        }
        sent
    }

    /// Events that carry their own ids and names (the entries of a Redis
    /// stream): `(id, bytes)` in order, to each subscriber of `to` that was
    /// not sent one as high; held for those whose catch-up runs. `live`:
    /// counted as live events (else as replayed ones, which are never held).
    pub(super) fn id_events(&self, to: &[ReqToken], events: &[(Vec<u8>, Rc<[u8]>)], live: bool) -> i64 {
        let mut sent = 0;
        for (id, bytes) in events {
            self.each(to, |sub| {
                let Some(ids) = sub.ids.as_mut() else { return };
                if !sse::is_after(id, ids.last.as_deref()) {
                    return;
                }
                if live {
                    if let Some(held) = ids.held.as_mut() {
                        return held.push(Some(id), bytes.clone());
                    }
                }
                ids.last = Some(id.clone());
                sent += i64::from(self.put(sub, bytes));
            });
        }
        self.shed();
        sent
    }

    /// What a replay needs to know of a subscription, if it is still there
    /// and its events carry ids.
    pub fn state(&self, t: ReqToken) -> Option<SubState> {
        let mut state = None;
        self.each(&[t], |sub| {
            state = sub.ids.as_ref().map(|ids| SubState {
                channel: sub.channel.clone(),
                tag: ids.tag,
                last: ids.last.clone(),
                holding: ids.holding(),
            });
        });
        state
    }

    /// The subscribers of `to` that are still there.
    pub fn live(&self, to: &[ReqToken]) -> Vec<ReqToken> {
        let mut out = Vec::with_capacity(to.len());
        self.each(to, |sub| out.push(sub.token));
        out
    }

    /// The log of a subscriber's request.
    pub fn log_of(&self, t: ReqToken) -> Option<Log> {
        let mut log = None;
        self.each(&[t], |sub| log = Some(sub.log()));
        log
    }

    /// A replay begins for each subscriber of `to`: their live events are
    /// held from now on.
    pub fn hold(&self, to: &[ReqToken]) {
        self.each(to, |sub| {
            if let Some(ids) = sub.ids.as_mut() {
                ids.held.get_or_insert_with(Held::default);
            }
        });
    }

    /// A round of the replay begins: what is let go from now on is counted.
    pub fn begin_round(&self, to: &[ReqToken]) {
        self.each(to, |sub| {
            if let Some(held) = sub.ids.as_mut().and_then(|i| i.held.as_mut()) {
                held.lapsed = false;
            }
        });
    }

    /// Held events were let go since the round began, for one of `to`.
    pub fn lapsed(&self, to: &[ReqToken]) -> bool {
        let mut lapsed = false;
        self.each(to, |sub| {
            lapsed |= sub.ids.as_ref().and_then(|i| i.held.as_ref()).is_some_and(|h| h.lapsed);
        });
        lapsed
    }

    /// Replayed events, `(id, data)` in order, to each subscriber of `to`
    /// that was not sent one as high.
    pub fn replayed<'a>(&self, to: &[ReqToken], channel: &str, rows: impl Iterator<Item = (&'a [u8], &'a [u8])>) {
        let mut sent = 0;
        for (id, data) in rows {
            let bytes = sse::event_with_id(id, channel, data);
            self.each(to, |sub| {
                let Some(ids) = sub.ids.as_mut() else { return };
                if !sse::is_after(id, ids.last.as_deref()) {
                    return;
                }
                ids.last = Some(id.to_vec());
                sent += i64::from(self.put(sub, &bytes));
            });
        }
        self.shed();
        metrics::add(Id::EventsSent, &[self.source], sent);
    }

    /// The replay is over for each subscriber of `to`: the held events
    /// above the last id go out, and live events flow from now on (the
    /// response header first, where it waited).
    pub fn release(&self, to: &[ReqToken]) {
        self.open(to);
        self.each(to, |sub| {
            let Some(held) = sub.ids.as_mut().and_then(|i| i.held.take()) else {
                return;
            };
            for (id, bytes) in held.events {
                let Some(ids) = sub.ids.as_mut() else { return };
                if let Some(id) = id {
                    if !sse::is_after(&id, ids.last.as_deref()) {
                        continue;
                    }
                    ids.last = Some(id);
                }
                if !self.put(sub, &bytes) {
                    return;
                }
            }
        });
        self.shed();
    }

    /// Sends the response header, and what waited behind it, of each
    /// subscriber of `to` that has not had it.
    pub fn open(&self, to: &[ReqToken]) {
        self.each(to, |sub| {
            if sub.header_out || sub.ended {
                return;
            }
            let opened = token::with_request(sub.req, |r| open_header(sub, r) && send(sub, r));
            if opened != Some(true) {
                end(sub, ERROR);
            }
        });
    }

    /// The most bytes one subscriber of `to` has waiting, once those that
    /// are too far behind (as an event would find them) are dropped.
    pub fn backlog(&self, to: &[ReqToken]) -> usize {
        let mut most = 0;
        self.each(to, |sub| {
            if token::with_request(sub.req, |r| too_far_behind(sub, r)) != Some(false) {
                self.dropped(sub.log(), super::Cannot::Behind);
                return end(sub, ERROR);
            }
            most = most.max(sub.out.waiting());
        });
        most
    }

    /// Ends the subscriptions of `to` whose replay failed: `status` (400,
    /// 502) for those whose response header has not gone out, the end of
    /// the stream for the others (their clients come back with their last
    /// id).
    pub fn fail(&self, to: &[ReqToken], status: ngx_int_t) {
        self.each(to, |sub| {
            let rc = if sub.header_out { OK } else { status };
            end(sub, rc);
        });
    }
}
