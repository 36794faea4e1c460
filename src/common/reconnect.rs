//! Reconnect supervision, the same for every hub's connections (Redis
//! SUBSCRIBE, Redis stream reading, PostgreSQL LISTEN): a connection that is
//! lost while anyone needs it is tried again every `RETRY` ms (to the next
//! of its addresses), its outage is logged and told once (hub::Outage), and
//! a connection that comes back is told apart from a first one (its hub
//! subscribes or reads again, and tells its subscribers of the gap).
//!
//! A hub keeps a `Supervisor` per connection. The connection's socket and
//! timers carry the address of its `Seat` (the hub, and the connection's
//! place there), shared (`Rc`) and so stable by construction however the hub
//! keeps its connections; an event reaches the hub through `hub::lend`.

use std::ffi::c_void;
use std::fmt;
use std::rc::Rc;

use super::hub::{lend, Failed, Outage, RETRY};
use crate::ffi::*;

/// Where a connection's events find it.
struct Seat {
    hub: *mut c_void,
    index: usize,
}

/// One connection's supervision: its retry timer, its outage, the address
/// it tries next.
pub struct Supervisor {
    seat: Rc<Seat>,
    retry: RetryTimer,
    outage: Outage,
    /// It had been up before: coming back is a reconnect.
    was_up: bool,
    /// The address it tries next (the one in use while it is up), of `addrs`.
    next: usize,
    addrs: usize,
}

impl Supervisor {
    /// The supervision of connection `index` of hub `hub` (boxed, or
    /// otherwise unmoved for as long as the connection may have events),
    /// over `addrs` addresses.
    pub fn new<S: Supervised>(hub: *mut S, index: usize, addrs: usize) -> Supervisor {
        let seat = Rc::new(Seat { hub: hub.cast(), index });
        let data = Rc::as_ptr(&seat) as *mut c_void;
        Supervisor {
            seat,
            retry: RetryTimer::new(data, Some(retry_event::<S>)),
            outage: Outage::default(),
            was_up: false,
            next: 0,
            addrs: addrs.max(1),
        }
    }

    /// What the connection's socket and timers carry (`lend_seat`).
    pub fn data(&self) -> *mut c_void {
        Rc::as_ptr(&self.seat) as *mut c_void
    }

    /// The address it tries next, or is connected to.
    pub fn next(&self) -> usize {
        self.next
    }

    /// Its retry is on the way.
    pub fn retrying(&self) -> bool {
        self.retry.pending()
    }

    /// It is up (its server answered): the outage ends (its notice); true
    /// when it had been up before (a reconnect).
    pub fn up(&mut self, what: fmt::Arguments<'_>) -> bool {
        self.outage.up(what);
        std::mem::replace(&mut self.was_up, true)
    }

    /// Its subscribers were told of an outage, and it is not up again.
    pub fn told(&self) -> bool {
        self.outage.told()
    }

    /// Nobody needs it any more: no retry, no outage followed, and one
    /// made later is no reconnect.
    pub fn forget(&mut self) {
        self.retry.stop();
        self.outage.forget();
        self.was_up = false;
    }

    /// A failure (logged), then the next address in `RETRY` ms.
    fn failed(&mut self, was_up: bool, why: &str, what: fmt::Arguments<'_>) -> Failed {
        let failed = self.outage.failed_logged(was_up, why, what);
        self.next = (self.next + 1) % self.addrs;
        self.retry.start(RETRY);
        failed
    }
}

/// A hub whose connections are supervised: what `lost` and the retry timer
/// ask of it.
pub trait Supervised: Sized {
    fn supervisor(&mut self, i: usize) -> &mut Supervisor;
    /// Connection `i`, as the log names it ("cache: the subscribing
    /// connection to ... of upstream ...").
    fn what(&self, i: usize) -> String;
    /// Closes connection `i` and forgets what was on its way on it: true
    /// when it was up.
    fn close_link(&mut self, i: usize) -> bool;
    /// Anyone needs the connections (subscribers).
    fn wanted(&self) -> bool;
    /// No connection is up or on its way.
    fn all_down(&self) -> bool;
    /// Its subscribers were told (or are to be) that the servers are
    /// unavailable, and no connection is up since.
    fn told(&mut self) -> &mut bool;
    /// After a loss while wanted: `tell`, the subscribers are to hear that
    /// the servers are unavailable (once an outage).
    fn after_loss(&mut self, i: usize, was_up: bool, tell: bool);
    /// The retry timer of connection `i`: it is made again, if it is still
    /// needed.
    fn reconnect(&mut self, i: usize);
}

/// Connection `i` of a hub is gone (`why`): closed, and tried again later
/// while it is needed; the outage is logged, and told when every
/// connection is down.
pub fn lost<S: Supervised>(h: &mut S, i: usize, why: &str) {
    let was_up = h.close_link(i);
    if !h.wanted() {
        return;
    }
    let what = h.what(i);
    let failed = h.supervisor(i).failed(was_up, why, format_args!("{what}"));
    let tell = failed.tell && !*h.told() && h.all_down();
    if tell {
        *h.told() = true;
    }
    h.after_loss(i, was_up, tell);
}

/// Runs `f` on the hub and connection index of an event's data, the hub
/// lent for the call only (`hub::lend`).
///
/// # Safety
/// `data` is a live `Supervisor`'s (`Supervisor::data`) of a hub of type
/// `S`, which lives, unmoved, for as long as its connections have events.
pub unsafe fn lend_seat<S: Supervised, T>(data: *mut c_void, f: impl FnOnce(&mut S, usize) -> T) -> T {
    // SAFETY: as the caller's.
    unsafe { SeatRef::from_data(data) }.lend(f)
}

/// A connection's seat as its event reads it: its hub and its index.
pub struct SeatRef<S> {
    hub: *mut S,
    index: usize,
}

impl<S: Supervised> SeatRef<S> {
    /// # Safety
    /// As `lend_seat`, for as long as the `SeatRef` is used (an event).
    pub unsafe fn from_data(data: *mut c_void) -> SeatRef<S> {
        // SAFETY: the seat is live (its Supervisor is), shared (Rc):
        // reading it makes no claim on the hub.
        let seat = unsafe { &*(data as *const Seat) };
        SeatRef {
            hub: seat.hub.cast(),
            index: seat.index,
        }
    }

    /// Runs `f` with the hub lent (`hub::lend`) and the connection's index.
    pub fn lend<T>(&self, f: impl FnOnce(&mut S, usize) -> T) -> T {
        let index = self.index;
        let f = move |h: &mut S| f(h, index);
        // SAFETY: the hub is live and unmoved (from_data).
        unsafe { lend(self.hub, f) }
    }
}

/// Runs `f` for an event of a connection under the panic guard: after a
/// panic (the hub's loan ended as it unwound) the connection is lost, and
/// made again.
pub fn step_seat<S: Supervised>(seat: SeatRef<S>, entry: &str, f: impl FnOnce(&mut S, usize)) {
    let ok = guard(Log::cycle(), entry, false, || {
        seat.lend(|h, i| {
            fault_point("connection step");
            f(h, i)
        });
        true
    });
    if !ok {
        seat.lend(|h, i| lost(h, i, "an internal error (a panic) in the module"));
    }
}

event_handler! {
    /// A lost connection is made again. (The timer's data is its
    /// Supervisor's seat.)
    fn retry_event<S: Supervised>(ev) = "reconnect timer", {
        ev.take_timedout();
        if exiting() {
            return;
        }
        // SAFETY: the timer is a Supervisor's (new), which stops it before
        // it goes.
        unsafe { SeatRef::<S>::from_data(ev.data()) }.lend(|h, i| h.reconnect(i));
    }
}
