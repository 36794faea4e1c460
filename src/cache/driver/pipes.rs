//! The worker's pipelined connections (pipe.rs), and which one a request
//! goes on.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use super::conn::Owner;
use super::pipe::{PipeConn, DEPTH, MAX_CONNS};
use super::{Endpoint, PipeId, Sink};
use crate::cache::error::{Error, Kind};
use crate::ffi::*;

/// The worker's pipelined connections (driver::pipes). Each is shared
/// (`Rc`) and lent one use at a time (`RefCell`): an event of a connection
/// finds it by its number, holds it while its step runs, and delivers what
/// the step left once it is not lent any more; a connection the list drops
/// meanwhile lives on until then. No pointer to a connection is kept
/// anywhere else.
#[derive(Default)]
pub struct Pipes {
    conns: RefCell<Vec<(PipeId, Rc<RefCell<PipeConn>>)>>,
    next_id: Cell<u64>,
}

impl Pipes {
    /// A connection for a request to `addr` (and `auth`): the oldest one
    /// that is neither deep nor slow (one in the request's database before
    /// the others), else a new one (up to `MAX_CONNS`), else the least
    /// loaded.
    pub fn pick(&self, to: &Endpoint<'_>, sink: &'static dyn Sink) -> Result<PipeId, Error> {
        let mut conns = self.conns.borrow_mut();
        // Closed connections go (their requests heard of it, and their
        // events are off; one still lent lives until its loan ends).
        conns.retain(|(_, c)| c.try_borrow().map_or(true, |c| !c.closed));
        let now = current_msec();
        let mut open = 0;
        let mut best: Option<(usize, bool, usize)> = None;
        let mut room = None;
        for (i, (_, c)) in conns.iter().enumerate() {
            // (One lent now is in the middle of a step: not chosen.)
            let Ok(c) = c.try_borrow() else { continue };
            if c.closed || c.retired || c.addr != to.addr || c.auth.as_deref() != to.auth || c.tls.as_ref() != to.tls {
                continue;
            }
            if c.paused || c.heavy {
                // Held by a slow client, or streaming a large value: no
                // request goes behind it, and it does not count against
                // the limit (one slow client each, as with a connection
                // per request).
                continue;
            }
            open += 1;
            let cand = (c.load(), c.slow(now), i);
            if !cand.1 && cand.0 < DEPTH {
                // The oldest connection with room, one already in the
                // request's database first: one deep pipeline costs Redis
                // and the worker fewer reads and writes than several
                // shallow ones, and a SELECT less.
                if c.tail_db == Some(to.db) {
                    room = Some(i);
                    break;
                }
                room = room.or(Some(i));
            }
            let better = best.is_none_or(|(load, slow, _)| (cand.1, cand.0) < (slow, load));
            if better {
                best = Some(cand);
            }
        }
        if let Some(i) = room {
            return Ok(conns[i].0);
        }
        match best {
            Some((_, _, i)) if open >= MAX_CONNS => return Ok(conns[i].0),
            _ => {}
        }
        let id = PipeId(self.next_id.get());
        self.next_id.set(id.0 + 1);
        let c = PipeConn::open(id, to, sink)?;
        if c.is_closed() {
            // (It failed at once: a TLS setup that could not start, say.)
            return Err(Error::because(Kind::Connect, c.closed_why.clone()));
        }
        conns.push((id, Rc::new(RefCell::new(c))));
        Ok(id)
    }

    /// Closes every connection to `addr` (a master that is one no more):
    /// the requests on them go on to the next try. (A connection lent now
    /// is the one whose step calls this: it is left to that step.)
    pub fn close_to(&self, addr: std::net::SocketAddr, why: &str) {
        let ids: Vec<PipeId> = self
            .conns
            .borrow()
            .iter()
            .filter(|(_, c)| {
                c.try_borrow()
                    .is_ok_and(|c| !c.closed && crate::ffi::conf::socket_addr(&c.addr) == Some(addr))
            })
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.with(id, |c| c.close(why));
        }
    }

    /// A connection, by its number (None: it is gone).
    fn get(&self, id: PipeId) -> Option<Rc<RefCell<PipeConn>>> {
        let conns = self.conns.borrow();
        conns.iter().find(|(i, _)| *i == id).map(|(_, c)| c.clone())
    }

    /// Lends a connection to `f`, for the call only (what its steps leave
    /// for others stays with it: `with` delivers it). A connection lent
    /// already (a step that reaches it again) panics instead of being lent
    /// twice.
    pub(super) fn lend<T>(&self, id: PipeId, f: impl FnOnce(&mut PipeConn) -> T) -> Option<T> {
        let c = self.get(id)?;
        let mut c = c.borrow_mut();
        Some(f(&mut c))
    }

    /// Runs `f` on a connection; what its steps deliver is delivered after,
    /// once it is not lent any more.
    pub fn with<T>(&self, id: PipeId, f: impl FnOnce(&mut PipeConn) -> T) -> Option<T> {
        let (t, out) = self.lend(id, |c| (f(c), c.take_out()))?;
        PipeConn::deliver(out);
        Some(t)
    }
}
