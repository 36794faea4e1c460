//! The listening connection (`sqldb_listen`): one per worker and upstream,
//! shared by every subscriber of every channel. LISTEN when a channel's
//! first subscriber comes, UNLISTEN after its last one leaves; each
//! notification goes to its channel's subscribers through a `HubSink` (common::hub).
//! A connection that is lost is made again (every `RETRY` ms, while anyone
//! is subscribed), listens to every channel again, and the subscribers are
//! told (notifications sent in between are lost). While the server cannot
//! be reached, the log and the subscribers hear it once (hub::Outage).

use std::collections::{HashMap, VecDeque};
use std::ffi::CString;

use super::pq::{PgConn, Poll};
use crate::common::hub::{self, Added, Channels, Hub, HubSink};
use crate::common::reconnect::{self, SeatRef, Supervised, Supervisor};
use crate::common::token::ReqToken;
use crate::ffi::*;
use crate::log;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Down,
    Connecting,
    Up,
}

pub struct Listener {
    conninfo: CString,
    /// The server, for the log.
    name: String,
    sink: &'static dyn HubSink,
    channels: Channels,
    pg: Option<PgConn>,
    socket: Option<Socket>,
    state: State,
    /// LISTEN / UNLISTEN statements to send, one at a time (with the
    /// channel a LISTEN confirms).
    queue: VecDeque<(CString, Option<String>)>,
    /// The channel of the LISTEN being read, and whether it failed.
    in_flight: Option<(String, bool)>,
    /// A statement's results are being read.
    busy: bool,
    /// Its retry and its outage; whether it had been up before (the
    /// subscribers then hear of the gap). Its events find it through it.
    sup: Supervisor,
    /// Its subscribers were told (or are to be) that the server is
    /// unavailable, and it is not up since.
    told: bool,
    /// Tells the subscribers the server is unavailable (posted: a failure
    /// may come while a request subscribes).
    tell_later: RetryTimer,
    /// When each channel was confirmed on the connection now up (a count
    /// of confirmations): a replay that ran while it stayed so missed no
    /// notification.
    confirmed: HashMap<String, u64>,
    confirmations: u64,
}

fn quoted(channel: &str) -> String {
    // Channel names are identifiers of [A-Za-z0-9_$] (core::sse): quoted
    // as they are, so that their letter case is kept.
    format!("\"{channel}\"")
}

impl Listener {
    pub fn new(conninfo: CString, name: String, sink: &'static dyn HubSink) -> Box<Listener> {
        let mut l = Box::new(Listener {
            conninfo,
            name,
            sink,
            channels: Channels::default(),
            pg: None,
            socket: None,
            state: State::Down,
            queue: VecDeque::new(),
            in_flight: None,
            busy: false,
            sup: Supervisor::new::<Listener>(std::ptr::null_mut(), 0, 1),
            told: false,
            tell_later: RetryTimer::new(std::ptr::null_mut(), Some(tell_event)),
            confirmed: HashMap::new(),
            confirmations: 0,
        });
        let data: *mut Listener = &mut *l;
        l.sup = Supervisor::new(data, 0, 1);
        l.tell_later.set_data(data.cast());
        l
    }

    /// A subscriber of `channel` comes: LISTEN if it is the first.
    fn add(&mut self, channel: &str, who: ReqToken) -> bool {
        let added = self.channels.add(channel, who);
        if added == Added::First {
            self.listen(channel);
        }
        if self.state == State::Down && !self.sup.retrying() {
            self.connect();
        }
        added == Added::Active
    }

    fn listen(&mut self, channel: &str) {
        self.command(&format!("LISTEN {}", quoted(channel)), Some(channel.to_owned()));
    }

    /// A subscriber leaves: UNLISTEN after the channel's last one.
    fn remove(&mut self, channel: &str, who: ReqToken) {
        self.sink.left(who);
        if !self.channels.remove(channel, who) {
            return;
        }
        self.confirmed.remove(channel);
        if self.channels.is_empty() {
            // Nobody listens any more: the connection goes too.
            self.close();
        } else {
            self.command(&format!("UNLISTEN {}", quoted(channel)), None);
        }
    }

    /// Closes the connection (no retry).
    fn close(&mut self) {
        // (A connection made later for new subscribers is no reconnect.)
        self.sup.forget();
        self.told = false;
        self.tell_later.stop();
        if let Some(s) = self.socket.take() {
            s.release();
        }
        self.pg = None;
        self.state = State::Down;
        self.busy = false;
        self.queue.clear();
        self.in_flight = None;
        self.channels.deactivate();
        self.confirmed.clear();
    }

    fn command(&mut self, sql: &str, confirms: Option<String>) {
        if self.state != State::Up {
            // Sent (as one LISTEN per channel) once the connection is up.
            return;
        }
        if let Ok(c) = CString::new(sql) {
            self.queue.push_back((c, confirms));
        }
        self.send_next();
    }

    fn connect(&mut self) {
        let pg = match PgConn::start(&self.conninfo) {
            Ok(pg) => pg,
            Err(e) => return self.lost(&format!("connecting failed: {e}")),
        };
        let Some(socket) = Socket::get(pg.socket(), Log::cycle()) else {
            return self.lost("no free connection");
        };
        socket.set_data(self.sup.data());
        socket.set_handler(Some(listen_event));
        // nginx tells an idle connection when it exits (a reload, a quit).
        socket.set_idle(true);
        self.pg = Some(pg);
        self.socket = Some(socket);
        self.state = State::Connecting;
        self.busy = false;
        self.queue.clear();
        let watched = self
            .socket
            .as_ref()
            .is_some_and(|s| s.watch_read(true) && s.watch_write(true));
        if !watched {
            self.lost("cannot watch the connection");
        }
    }

    /// The connection is gone: try again later while anyone listens
    /// (common::reconnect).
    fn lost(&mut self, why: &str) {
        reconnect::lost(self, 0, why);
    }

    fn on_event(&mut self) {
        if self.socket.as_ref().is_some_and(Socket::close_requested) {
            // nginx is exiting: the subscriptions end, the connection closes.
            let all = self.channels.everyone();
            self.close();
            self.sink.closing(&all);
            return;
        }
        match self.state {
            State::Down => {}
            State::Connecting => self.connecting(),
            State::Up => self.read(),
        }
    }

    fn connecting(&mut self) {
        let Some(pg) = self.pg.as_mut() else { return };
        let watch_write = match pg.poll_connect() {
            Poll::Reading => false,
            Poll::Writing => true,
            Poll::Failed => {
                let msg = pg.error_message();
                return self.lost(&msg);
            }
            Poll::Ready => {
                if self.socket.as_ref().map(Socket::fd) != Some(pg.socket()) {
                    return self.lost("libpq replaced its socket while connecting");
                }
                if let Err(e) = pg.set_nonblocking() {
                    return self.lost(&e.0);
                }
                self.state = State::Up;
                let what = self.what(0);
                let again = self.sup.up(format_args!("{what}"));
                self.told = false;
                let channels: Vec<String> = self.channels.names().map(str::to_owned).collect();
                for c in channels {
                    self.listen(&c);
                }
                if again {
                    let all = self.channels.settled();
                    self.sink.reconnected(&all);
                }
                // (Writability was watched while connecting.)
                self.flush();
                return;
            }
        };
        if !self.socket.as_ref().is_some_and(|s| s.watch_write(watch_write)) {
            self.lost("cannot watch the connection");
        }
    }

    fn send_next(&mut self) {
        if self.busy || self.state != State::Up {
            return;
        }
        let Some((sql, confirms)) = self.queue.pop_front() else {
            return;
        };
        let Some(pg) = self.pg.as_mut() else { return };
        if let Err(e) = pg.send_query(&sql) {
            return self.lost(&e.0);
        }
        self.busy = true;
        self.in_flight = confirms.map(|c| (c, false));
        self.flush();
    }

    /// Pushes out what libpq holds; writability is watched only while
    /// some is left (the watch is level-triggered: left on, an idle
    /// connection would wake the worker at every turn).
    fn flush(&mut self) {
        let Some(pg) = self.pg.as_mut() else { return };
        match pg.flush() {
            Ok(more) => {
                if !self.socket.as_ref().is_some_and(|s| s.watch_write(more)) {
                    self.lost("cannot watch the connection");
                }
            }
            Err(e) => self.lost(&e.0),
        }
    }

    fn read(&mut self) {
        self.flush();
        let Some(pg) = self.pg.as_mut() else { return };
        if let Err(e) = pg.consume_input() {
            return self.lost(&e.0);
        }
        if pg.is_bad() {
            let msg = pg.error_message();
            return self.lost(&msg);
        }
        // The results of LISTEN / UNLISTEN: read to their end.
        while self.busy && !pg.is_busy() {
            match pg.get_result() {
                Some(res) => {
                    let status = res.status_name();
                    if !status.contains("COMMAND_OK") {
                        if let Some(f) = self.in_flight.as_mut() {
                            f.1 = true;
                        }
                        log!(
                            NGX_LOG_ERR,
                            Log::cycle(),
                            "sqldb: LISTEN on {} failed: {}",
                            self.name,
                            res.error_message()
                        );
                    }
                }
                None => {
                    self.busy = false;
                    if let Some((channel, false)) = self.in_flight.take() {
                        let to = self.channels.confirm(&channel);
                        self.confirmations += 1;
                        self.confirmed.insert(channel.clone(), self.confirmations);
                        self.sink.subscribed(&to);
                        self.sink.listening(&channel);
                    }
                }
            }
        }
        let notes = pg.notifies();
        for (channel, payload) in notes {
            if let Some((_, to)) = self.channels.get(&channel) {
                self.sink.notify(to, &channel, &payload);
            }
        }
        self.send_next();
    }
}

impl Listener {
    /// The channel is listened to on the connection now up: since which
    /// confirmation (the same number as long as it stays so).
    pub fn in_effect(&self, channel: &str) -> Option<u64> {
        if self.state != State::Up {
            return None;
        }
        self.confirmed.get(channel).copied()
    }
}

impl Hub for Listener {
    fn subscribe(&mut self, channel: &str, who: ReqToken) -> bool {
        self.add(channel, who)
    }

    fn unsubscribe(&mut self, channel: &str, who: ReqToken) {
        self.remove(channel, who)
    }

    fn servers(&self) -> Vec<String> {
        vec![self.name.clone()]
    }

    fn unavailable(&self) -> bool {
        self.sup.told() && !self.tell_later.posted()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.close();
    }
}

impl Supervised for Listener {
    fn supervisor(&mut self, _: usize) -> &mut Supervisor {
        &mut self.sup
    }

    fn what(&self, _: usize) -> String {
        format!("sqldb: the listening connection to {}", self.name)
    }

    fn close_link(&mut self, _: usize) -> bool {
        if let Some(s) = self.socket.take() {
            s.release();
        }
        self.pg = None;
        let was = std::mem::replace(&mut self.state, State::Down);
        self.busy = false;
        self.queue.clear();
        self.in_flight = None;
        self.channels.deactivate();
        self.confirmed.clear();
        was == State::Up
    }

    fn wanted(&self) -> bool {
        !self.channels.is_empty()
    }

    fn all_down(&self) -> bool {
        self.state == State::Down
    }

    fn told(&mut self) -> &mut bool {
        &mut self.told
    }

    /// The subscribers hear of an outage (posted: a failure may come
    /// while a request subscribes).
    fn after_loss(&mut self, _: usize, _: bool, tell: bool) {
        if tell {
            self.tell_later.post();
        }
    }

    fn reconnect(&mut self, _: usize) {
        if self.state == State::Down && !self.channels.is_empty() {
            self.connect();
        }
    }
}

event_handler! {
    /// Read/write readiness of the listening connection.
    fn listen_event(ev) = "sqldb listen event", {
        ev.take_timedout();
        // SAFETY: the connection's data is its Listener's supervisor's (the
        // Listener is boxed, and releases the connection before it goes).
        let seat = unsafe { SeatRef::<Listener>::from_data(ev.connection_data()) };
        reconnect::step_seat(seat, "sqldb listen step", |l, _| l.on_event());
    }
}

event_handler! {
    /// The subscribers hear that the server cannot be reached.
    fn tell_event(ev) = "sqldb listen unavailable", {
        // SAFETY: the event's data is the Listener that owns it (its Drop
        // takes the event out of the queue).
        let tell = |l: &mut Listener| {
            if l.sup.told() {
                let all = l.channels.everyone();
                l.sink.unavailable(&all);
            }
        };
        // SAFETY: see above.
        unsafe { hub::lend(ev.data() as *mut Listener, tell) };
    }
}
