//! The worker's pipelined connections (pipe.rs), and which one a request
//! goes on.

use std::cell::{Cell, RefCell};

use super::pipe::{PipeConn, DEPTH, MAX_CONNS};
use super::{Endpoint, OpenError, PipeId, Sink};
use crate::ffi::*;

/// The worker's pipelined connections (driver::pipes).
#[derive(Default)]
pub struct Pipes {
    // Boxed: a connection's events point at it, and it must not move when
    // the list grows.
    #[allow(clippy::vec_box)]
    conns: RefCell<Vec<Box<PipeConn>>>,
    next_id: Cell<u64>,
}

impl Pipes {
    /// A connection for a request to `addr` (and `auth`): the oldest one
    /// that is neither deep nor slow (one in the request's database before
    /// the others), else a new one (up to `MAX_CONNS`), else the least
    /// loaded.
    pub fn pick(&self, to: &Endpoint<'_>, sink: &'static dyn Sink) -> Result<PipeId, OpenError> {
        let mut conns = self.conns.borrow_mut();
        // Closed connections go (nothing refers to them: their requests
        // heard of it, and their events are off).
        conns.retain(|c| !c.closed);
        let now = current_msec();
        let mut open = 0;
        let mut best: Option<(usize, bool, usize)> = None;
        let mut room = None;
        for (i, c) in conns.iter().enumerate() {
            if c.retired || c.addr != to.addr || c.auth.as_deref() != to.auth || c.tls.as_ref() != to.tls {
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
            return Ok(conns[i].id);
        }
        match best {
            Some((_, _, i)) if open >= MAX_CONNS => return Ok(conns[i].id),
            _ => {}
        }
        let id = PipeId(self.next_id.get());
        self.next_id.set(id.0 + 1);
        let c = PipeConn::open(id, to, sink)?;
        if c.is_closed() {
            // (It failed at once: a TLS setup that could not start, say.)
            return Err(OpenError::Failed(c.closed_why.clone()));
        }
        conns.push(c);
        Ok(id)
    }

    /// Closes every connection to `addr` (a master that is one no more):
    /// the requests on them go on to the next try.
    pub fn close_to(&self, addr: std::net::SocketAddr, why: &str) {
        let ids: Vec<PipeId> = self
            .conns
            .borrow()
            .iter()
            .filter(|c| !c.closed && crate::ffi::conf::socket_addr(&c.addr) == Some(addr))
            .map(|c| c.id)
            .collect();
        for id in ids {
            self.with(id, |c| c.close(why));
        }
    }

    /// Runs `f` on a connection; what its steps deliver is delivered after.
    pub fn with<T>(&self, id: PipeId, f: impl FnOnce(&mut PipeConn) -> T) -> Option<T> {
        let (t, out, sink) = {
            let mut conns = self.conns.borrow_mut();
            let c = conns.iter_mut().find(|c| c.id == id)?;
            let t = f(c);
            (t, c.take_deliveries(), c.sink)
        };
        if !out.is_empty() {
            sink.deliver(out);
        }
        Some(t)
    }
}
