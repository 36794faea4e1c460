//! nginx events, their timers, and the nginx connections the module keeps
//! for sockets of its own (database connections, cancel requests).

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::rc::Rc;

use super::*;

/// epoll's values of NGX_READ_EVENT / NGX_WRITE_EVENT on Linux (the C macros
/// are expressions that bindgen does not export).
const READ_EVENT: ngx_uint_t = (libc::EPOLLIN | libc::EPOLLRDHUP) as ngx_uint_t;
const WRITE_EVENT: ngx_uint_t = libc::EPOLLOUT as ngx_uint_t;
/// Level-triggered registration (NGX_LEVEL_EVENT is 0 with epoll).
const LEVEL_EVENT: ngx_uint_t = 0;

/// An nginx event: one a handler was called for, or one of the module's.
/// A handle, not a copy: it borrows what the event belongs to (`'a`: the
/// socket or request it came from), so it cannot outlive it.
#[derive(Debug)]
pub struct Event<'a>(NonNull<ngx_event_t>, PhantomData<&'a mut ngx_event_t>);

impl<'a> Event<'a> {
    /// # Safety
    /// `ev` must be a live event that outlives `'a`.
    pub unsafe fn from_raw(ev: *mut ngx_event_t) -> Option<Event<'a>> {
        NonNull::new(ev).map(|ev| Event(ev, PhantomData))
    }

    /// The event for `f`, borrowed for the call only (a handle to memory
    /// nginx owns, like a raw pointer). Every `f` here reads or writes its
    /// fields and calls nothing back.
    fn with<T>(&self, f: impl FnOnce(&mut ngx_event_t) -> T) -> T {
        // SAFETY: a live event (from_raw); nginx runs one handler at a time
        // on this thread, and `f` makes no other reference to it.
        f(unsafe { &mut *self.0.as_ptr() })
    }

    pub fn as_ptr(&self) -> *mut ngx_event_t {
        self.0.as_ptr()
    }

    /// Whether its timer fired; the flag is cleared.
    pub fn take_timedout(&self) -> bool {
        self.with(|ev| {
            let t = ev.timedout() != 0;
            ev.set_timedout(0);
            t
        })
    }

    pub fn is_write(&self) -> bool {
        self.with(|e| e.write() != 0)
    }

    /// What the event's owner stored in it (a connection, usually).
    pub fn data(&self) -> *mut c_void {
        self.with(|e| e.data)
    }

    /// The data of the connection the event belongs to.
    ///
    /// # Safety
    /// The event is a live connection's read or write event.
    pub unsafe fn connection_data(&self) -> *mut c_void {
        // SAFETY: as the caller promises: its data is its connection.
        unsafe { (*(self.data() as *mut ngx_connection_t)).data }
    }

    pub fn set_data(&self, data: *mut c_void) {
        self.with(|e| e.data = data);
    }

    pub fn set_handler(&self, handler: ngx_event_handler_pt) {
        self.with(|e| e.handler = handler);
    }

    pub fn set_log(&self, log: Log) {
        self.with(|e| e.log = log.as_ptr());
    }

    pub fn timer_set(&self) -> bool {
        self.with(|e| e.timer_set() != 0)
    }

    /// A client's write event that `limit_rate` holds back: its timer is
    /// the rate's, not a timeout.
    pub fn delayed(&self) -> bool {
        self.with(|e| e.delayed() != 0)
    }

    /// Arms the timer (re-arms it if set).
    pub fn add_timer(&self, ms: ngx_msec_t) {
        // SAFETY: a live event; nginx's timer tree is of this thread.
        unsafe { ngx_add_timer(self.as_ptr(), ms) }
    }

    pub fn del_timer(&self) {
        if self.timer_set() {
            // SAFETY: a live event whose timer is in the tree.
            unsafe { ngx_del_timer(self.as_ptr()) }
        }
    }

    /// No timer and not posted: nothing of nginx's points at it any more.
    pub fn clear(&self) {
        self.del_timer();
        if self.with(|e| e.posted() != 0) {
            // SAFETY: a live event in nginx's posted queue.
            unsafe { ngx_delete_posted_event(self.as_ptr()) }
        }
    }

    fn watch(&self, event: ngx_uint_t, on: bool) -> bool {
        let active = self.with(|e| e.active() != 0);
        if on == active {
            return true;
        }
        // SAFETY: the event module's actions are set before any request; the
        // event belongs to a live connection.
        unsafe {
            if on {
                ngx_event_actions
                    .add
                    .is_some_and(|add| add(self.as_ptr(), event as ngx_int_t, LEVEL_EVENT) == OK)
            } else {
                ngx_event_actions
                    .del
                    .is_some_and(|del| del(self.as_ptr(), event as ngx_int_t, 0) == OK)
            }
        }
    }
}

/// A timer of a request's (`Req::new_timer`), whose handler finds the
/// request as the event's data. The event is shared by the handle and the
/// request's pool: whichever goes first takes it out of nginx's timers,
/// and once the pool is gone its data is null (the handler then does
/// nothing), so a handle that outlives its request is harmless.
#[derive(Debug)]
pub struct Timer(Rc<TimerEvent>);

/// The event of a Timer (boxed by the Rc: it does not move).
#[derive(Debug)]
pub struct TimerEvent(UnsafeCell<ngx_event_t>);

impl TimerEvent {
    fn event(&self) -> Event<'_> {
        // SAFETY: the event lives as long as the TimerEvent (its Rc), which
        // does not move; it is used one handler at a time on this thread.
        unsafe { Event::from_raw(self.0.get()) }.expect("a timer's event")
    }
}

/// The request pool's share of a Timer: when the pool is destroyed, the
/// timer stops and forgets the request.
pub(super) struct TimerInPool(pub(super) Rc<TimerEvent>);

impl Drop for TimerInPool {
    fn drop(&mut self) {
        let ev = self.0.event();
        ev.clear();
        ev.set_data(std::ptr::null_mut());
    }
}

impl Timer {
    /// A timer (not armed) whose handler runs with `data` as the event's
    /// data, logging to `log`; the pool's share, to move into the pool.
    pub(super) fn new(data: *mut c_void, handler: ngx_event_handler_pt, log: Log) -> (Timer, TimerInPool) {
        // SAFETY: all-zero is the initial state of an event.
        let te = Rc::new(TimerEvent(UnsafeCell::new(unsafe { std::mem::zeroed() })));
        let ev = te.event();
        ev.set_data(data);
        ev.set_handler(handler);
        ev.set_log(log);
        let pool_share = TimerInPool(Rc::clone(&te));
        (Timer(te), pool_share)
    }

    /// Arms the timer (re-arms it if set), unless its request is gone.
    pub fn add_timer(&self, ms: ngx_msec_t) {
        let ev = self.0.event();
        if !ev.data().is_null() {
            ev.add_timer(ms);
        }
    }

    pub fn del_timer(&self) {
        self.0.event().del_timer();
    }

    /// No timer and not posted.
    pub fn clear(&self) {
        self.0.event().clear();
    }

    pub fn timer_set(&self) -> bool {
        self.0.event().timer_set()
    }

    /// Whether its timer fired; the flag is cleared.
    pub fn take_timedout(&self) -> bool {
        self.0.event().take_timedout()
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        self.0.event().clear();
    }
}

/// An nginx connection that watches a socket of the module's.
#[derive(Debug)]
pub struct Socket(NonNull<ngx_connection_t>);

impl Socket {
    /// Takes a free nginx connection for `fd` (None when nginx has none left:
    /// "worker_connections are not enough" is then in the log).
    pub fn get(fd: c_int, log: Log) -> Option<Socket> {
        // SAFETY: ngx_get_connection only records fd; nginx's connection
        // array is of this thread.
        let c = NonNull::new(unsafe { ngx_get_connection(fd, log.as_ptr()) })?;
        let s = Socket(c);
        // nginx leaves the events without a log; its debug lines need one.
        s.set_log(log);
        Some(s)
    }

    /// A connection that nginx connected (ngx_event_connect_peer), logging
    /// to `log` from now on, and watched as the module's other sockets are:
    /// nginx registered both its events edge-triggered (epoll's
    /// add_conn); the module's owners watch one event at a time,
    /// level-triggered (`watch_read`, `watch_write`), and stop watching
    /// reads while a client holds them back. Nothing is watched until
    /// they ask.
    ///
    /// # Safety
    /// `c` is a live connection of nginx's that nothing else uses.
    pub(super) unsafe fn adopt(c: NonNull<ngx_connection_t>, log: Log) -> Socket {
        let s = Socket(c);
        s.set_log(log);
        // SAFETY: the event module's actions are set before any connection
        // is made; the connection is live (as the caller promises).
        unsafe {
            match ngx_event_actions.del_conn {
                Some(del_conn) if s.read().with(|e| e.active() != 0) => {
                    del_conn(c.as_ptr(), 0);
                }
                _ => {
                    s.watch_read(false);
                    s.watch_write(false);
                }
            }
        }
        s
    }

    /// nginx's connection for `f`, borrowed for the call only (see
    /// Event::with).
    fn with<T>(&self, f: impl FnOnce(&mut ngx_connection_t) -> T) -> T {
        // SAFETY: the connection is live until released or closed (which
        // consume the Socket); handlers run one at a time on this thread,
        // and `f` makes no other reference to it.
        f(unsafe { &mut *self.0.as_ptr() })
    }

    pub fn as_ptr(&self) -> *mut ngx_connection_t {
        self.0.as_ptr()
    }

    /// The data of a connection nginx passes to a handler.
    ///
    /// # Safety
    /// `c` is null or a live connection.
    pub unsafe fn data_of_raw(c: *mut ngx_connection_t) -> Option<*mut c_void> {
        // SAFETY: as the caller promises.
        unsafe { c.as_ref() }.map(|c| c.data)
    }

    pub fn fd(&self) -> c_int {
        self.with(|c| c.fd)
    }

    pub fn read(&self) -> Event<'_> {
        // SAFETY: a live connection's read event lives as long as it.
        unsafe { Event::from_raw(self.with(|c| c.read)) }.expect("nginx connections have events")
    }

    pub fn write(&self) -> Event<'_> {
        // SAFETY: as for read.
        unsafe { Event::from_raw(self.with(|c| c.write)) }.expect("nginx connections have events")
    }

    /// What the handlers find in the connection's data.
    pub fn set_data(&self, data: *mut c_void) {
        self.with(|c| c.data = data);
    }

    pub fn set_handler(&self, handler: ngx_event_handler_pt) {
        self.read().set_handler(handler);
        self.write().set_handler(handler);
    }

    pub fn set_log(&self, log: Log) {
        self.with(|c| c.log = log.as_ptr());
        self.read().set_log(log);
        self.write().set_log(log);
    }

    /// Idle: nginx may close it when it shuts down (it then sets `close`).
    pub fn set_idle(&self, idle: bool) {
        self.with(|c| c.set_idle(idle as u32));
    }

    /// nginx asks for it to be closed (shutdown).
    pub fn close_requested(&self) -> bool {
        self.with(|c| c.close()) != 0
    }

    /// Watches readability (level-triggered, so no readiness is lost).
    pub fn watch_read(&self, on: bool) -> bool {
        self.read().watch(READ_EVENT, on)
    }

    pub fn watch_write(&self, on: bool) -> bool {
        self.write().watch(WRITE_EVENT, on)
    }

    /// TCP_CORK on (or off, which sends what was held): while on, what is
    /// written goes out only in full segments. False if the socket does
    /// not take it (not TCP).
    pub fn cork(&self, on: bool) -> bool {
        let v: c_int = on.into();
        // SAFETY: a plain setsockopt on the connection's own socket, with a
        // pointer to a live int and its size.
        let rc = unsafe {
            libc::setsockopt(
                self.fd(),
                libc::IPPROTO_TCP,
                libc::TCP_CORK,
                (&v as *const c_int).cast(),
                std::mem::size_of::<c_int>() as libc::socklen_t,
            )
        };
        rc == 0
    }

    /// Gives the nginx connection back; the socket stays open (its owner,
    /// libpq, closes it now: its events are not taken out of epoll, which
    /// drops them with the close).
    pub fn release(self) {
        self.give_back(NGX_CLOSE_EVENT as ngx_uint_t);
    }

    /// The nginx connection back to nginx's free list, its events taken
    /// out of the event module's watch with `flags`.
    fn give_back(self, flags: ngx_uint_t) {
        let (read, write) = (self.read(), self.write());
        read.clear();
        write.clear();
        // SAFETY: the event module's actions are set; the events are live.
        unsafe {
            for (ev, what) in [(read, READ_EVENT), (write, WRITE_EVENT)] {
                if ev.with(|e| e.active() != 0) {
                    if let Some(del) = ngx_event_actions.del {
                        del(ev.as_ptr(), what as ngx_int_t, flags);
                    }
                }
            }
            ngx_free_connection(self.as_ptr());
        }
        self.with(|c| c.fd = -1);
    }

    /// The owner's library closed this socket and made another (`fd`): the
    /// nginx connection follows it, with the same handler, data and log,
    /// nothing watched yet. (The closed one left epoll with its close.)
    /// False when nginx has no free connection (the old one stays).
    pub fn follow(&mut self, fd: c_int) -> bool {
        // SAFETY: a live connection's read event and log.
        let (data, handler, log) = self.with(|c| unsafe { (c.data, (*c.read).handler, Log::from_raw(c.log)) });
        // (The new one first: with nginx's free list empty the old one
        // stays, for its owner to give back as usual. With an fd map, nginx
        // keeps a slot for the new one and frees the old one's only if it
        // is still its own.)
        let Some(new) = Socket::get(fd, log) else {
            return false;
        };
        new.set_data(data);
        new.set_handler(handler);
        std::mem::replace(self, new).release();
        true
    }

    /// Gives the nginx connection back while its socket stays open for a
    /// while yet (its owner closes it later): the socket leaves the event
    /// module's watch now.
    pub fn release_open(self) {
        self.give_back(0);
    }

    /// Closes the connection and its socket.
    pub fn close(self) {
        // SAFETY: the connection and its socket are the module's own.
        unsafe { ngx_close_connection(self.as_ptr()) }
    }
}

/// One posted event of the module, for the worker's whole life (in a
/// thread-local of its user's, null until first used).
pub type DeferSlot = std::cell::Cell<*mut ngx_event_t>;

thread_local! {
    /// The event that runs deferred work after the current handler
    /// (nginx's posted events), one per worker.
    static DEFERRED: std::cell::Cell<*mut ngx_event_t> = const { std::cell::Cell::new(std::ptr::null_mut()) };
}

/// Runs `handler` once the current event handler returns (with nginx's
/// posted events, before the next wait for I/O). For work that must not
/// run inside the caller (a pool cleanup, say).
pub fn defer(handler: ngx_event_handler_pt) {
    DEFERRED.with(|slot| defer_on(slot, handler))
}

/// `defer` with an event of the caller's (`slot`, in a thread-local of
/// its own or one it shares with more state), so that deferred work
/// of different kinds does not share one event. Posting an event that is
/// already posted does nothing: the handler runs once.
pub fn defer_on(slot: &DeferSlot, handler: ngx_event_handler_pt) {
    if slot.get().is_null() {
        // One event per worker, for its whole life.
        // SAFETY: all-zero is the initial state of an event.
        let ev: Box<ngx_event_t> = Box::new(unsafe { std::mem::zeroed() });
        slot.set(Box::into_raw(ev));
    }
    let ev = slot.get();
    // SAFETY: the event lives for the worker's life (leaked above); nginx's
    // posted queue is of this thread.
    unsafe {
        (*ev).handler = handler;
        (*ev).log = Log::cycle().as_ptr();
        ngx_post_event(ev, std::ptr::addr_of_mut!(ngx_posted_events));
    }
}

/// A timer of the module's own that lives as long as its owner (boxed:
/// the event does not move), for a connection made again later. A worker
/// that exits does not wait for it.
pub struct RetryTimer(Box<ngx_event_t>);

impl RetryTimer {
    /// `handler` runs with the event's data set to `data`.
    pub fn new(data: *mut c_void, handler: ngx_event_handler_pt) -> RetryTimer {
        // SAFETY: all-zero is the initial state of an event.
        let mut ev: Box<ngx_event_t> = Box::new(unsafe { std::mem::zeroed() });
        ev.data = data;
        ev.handler = handler;
        ev.log = Log::cycle().as_ptr();
        ev.set_cancelable(1);
        RetryTimer(ev)
    }

    /// Set after `new`, once the owner is where it stays.
    pub fn set_data(&mut self, data: *mut c_void) {
        self.0.data = data;
    }

    pub fn pending(&self) -> bool {
        self.0.timer_set() != 0
    }

    /// It is in nginx's posted queue (`post`), not run yet.
    pub fn posted(&self) -> bool {
        self.0.posted() != 0
    }

    /// Starts the timer unless it runs already.
    pub fn start(&mut self, ms: ngx_msec_t) {
        if self.pending() {
            return;
        }
        // SAFETY: the timer's own event, which lives as long as it.
        if let Some(ev) = unsafe { Event::from_raw(&mut *self.0) } {
            ev.add_timer(ms);
        }
    }

    /// Runs the handler once the current event handler returns, with
    /// nginx's posted events (once, however often it is asked).
    pub fn post(&mut self) {
        if self.0.posted() != 0 {
            return;
        }
        // SAFETY: the timer's own event, which lives as long as it (Drop
        // takes it out of the queue); nginx's posted queue is this thread's.
        unsafe { ngx_post_event(&mut *self.0, std::ptr::addr_of_mut!(ngx_posted_events)) }
    }

    /// Runs the handler in the event loop's next turn, after the events
    /// that are ready by then (nginx's `ngx_posted_next_events`): what
    /// yields to the other connections posts itself so.
    pub fn post_next(&mut self) {
        if self.0.posted() != 0 {
            return;
        }
        // SAFETY: as for post; ngx_posted_next_events is this thread's too.
        unsafe { ngx_post_event(&mut *self.0, std::ptr::addr_of_mut!(ngx_posted_next_events)) }
    }

    pub fn stop(&mut self) {
        // SAFETY: as above.
        if let Some(ev) = unsafe { Event::from_raw(&mut *self.0) } {
            ev.clear();
        }
    }
}

impl Drop for RetryTimer {
    fn drop(&mut self) {
        self.stop();
    }
}
