//! The replicas of a set, for `cache_target replica | prefer-replica`: each
//! worker asks the confirmed master and each replica the Sentinels list (up
//! to `MAX_REPLICAS`, those no Sentinel finds down) `ROLE` every `PROBE_MS`,
//! on a kept connection each (`AUTH` first when the locations have
//! `cache_auth`).
//!
//! A replica is used only while its last `ROLE` (answered within the last
//! `FRESH_MS`) says `slave`, that its link to the master is `connected`,
//! and that its master is the one confirmed. Its lag is measured by
//! replication offsets: the master's offset is kept with the time it was
//! read; a replica whose offset has reached the master's offset read at
//! time t holds every write the master took before t, so its lag is the
//! time since the latest such t (a replica in step under writes: about
//! one round; none read yet, or the replica behind every one kept: not
//! used).

use std::collections::VecDeque;
use std::net::SocketAddr;

use gateway_core::resp::{self, Value};

use super::reply::{is_bulk, parse_addr};
use super::{with_set, Due, SetConf, SetState, MAX_REPLICAS, PMASTER, PREPLICA, QUERY};
use crate::cache::driver::conn::State;
use crate::ffi::*;

/// How often the master and the replicas are asked `ROLE` (ms).
pub const PROBE_MS: ngx_msec_t = 500;
/// A replica whose last `ROLE` is older than this is not used (ms).
pub const FRESH_MS: ngx_msec_t = 2 * PROBE_MS + 500;
/// The master's offsets kept (one a round: a minute).
const HISTORY: usize = 120;

/// What a replica's last `ROLE` said.
#[derive(Debug, Clone, Copy, Default)]
pub struct Probe {
    pub addr: Option<SocketAddr>,
    /// `slave`, `connected`, to the confirmed master.
    pub ok: bool,
    /// Its replication offset, and when it was read.
    pub offset: i64,
    pub at: ngx_msec_t,
}

/// The master's replication offsets, with when each was read.
#[derive(Default)]
pub struct Offsets(VecDeque<(ngx_msec_t, i64)>);

impl Offsets {
    fn add(&mut self, at: ngx_msec_t, offset: i64) {
        if self.0.len() >= HISTORY {
            self.0.pop_front();
        }
        self.0.push_back((at, offset));
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// How long ago (at `now`) the master had no write that a replica at
    /// `offset` lacks: None when it is behind every offset kept.
    pub fn lag(&self, offset: i64, now: ngx_msec_t) -> Option<ngx_msec_t> {
        let (at, _) = self.0.iter().rev().find(|(_, o)| *o <= offset)?;
        Some(now.saturating_sub(*at))
    }
}

/// A replica a read may go to now, with a lag of at most `max_lag`
/// None when none is. `take`: the read goes there (the next
/// one goes to the next replica).
pub fn replica(key: usize, conf: impl FnOnce() -> SetConf, max_lag: ngx_msec_t, take: bool) -> Option<SocketAddr> {
    with_set(conf, key, |s| s.pick_replica(max_lag, take))
}

/// A request found replica `addr` refusing a connection or not answering:
/// it is not used until it answers `ROLE` again.
pub fn replica_failed(key: usize, conf: impl FnOnce() -> SetConf, addr: SocketAddr) {
    with_set(conf, key, |s| s.replica_failed(addr))
}

impl SetState {
    /// `+slave`, `+sdown`, `-sdown` `slave IP:PORT IP PORT @ NAME ...`: a
    /// replica of the set came, went down or came back: the replicas are
    /// asked for again (not the master: a Sentinel that has not heard of a
    /// switch yet still names the old one, which says it is a master until
    /// it is made a replica).
    pub(super) fn replica_event(&mut self, text: &[u8]) {
        let parts: Vec<&[u8]> = text.split(|b| *b == b' ').collect();
        if let [b"slave", _, _, _, b"@", name, ..] = parts[..] {
            if name == self.conf.name.as_slice() {
                self.replicas_stale = true;
            }
        }
    }

    /// A round: `ROLE` to the master and to each replica (the timer's).
    pub(super) fn probe(&mut self) {
        if exiting() {
            return;
        }
        self.probe_timer.start(PROBE_MS);
        if self.replicas_stale && self.idle() {
            self.query_replicas();
        }
        let Some(master) = self.master else {
            return;
        };
        self.probe_one(PMASTER, master);
        // (Those no Sentinel finds down: whether their link to the master
        // is up, their own ROLE says, sooner than the Sentinels do.)
        let mut want: Vec<SocketAddr> = self.replicas.iter().filter(|r| !r.down).map(|r| r.addr).collect();
        want.sort();
        want.truncate(MAX_REPLICAS);
        // A replica keeps its probe while it is listed; those no longer
        // listed are dropped, and the new ones take the free probes.
        for k in 0..MAX_REPLICAS {
            let keep = self.probes[k].addr.is_some_and(|a| want.contains(&a));
            if !keep && self.probes[k].addr.is_some() {
                self.links[PREPLICA + k].conn.close();
                self.links[PREPLICA + k].due.clear();
                self.links[PREPLICA + k].peer = None;
                self.probes[k] = Probe::default();
            }
        }
        for a in want {
            let at = match self.probes.iter().position(|p| p.addr == Some(a)) {
                Some(k) => k,
                None => match self.probes.iter().position(|p| p.addr.is_none()) {
                    Some(k) => k,
                    None => break,
                },
            };
            self.probe_one(PREPLICA + at, a);
        }
    }

    /// Asks a Sentinel for the replicas only.
    fn query_replicas(&mut self) {
        self.replicas_stale = false;
        self.replicas_only = true;
        let addr = self.conf.sentinels[self.ask % self.conf.sentinels.len()];
        let (mut out, mut due) = (Vec::new(), VecDeque::new());
        self.sentinel_auth(&mut out, &mut due);
        resp::command(&mut out, &[b"SENTINEL", b"replicas", &self.conf.name]);
        due.push_back(Due::ReplicasOnly);
        self.open(QUERY, addr, out, due);
    }

    /// The replicas are answered.
    pub(super) fn replicas_answered(&mut self) {
        self.replicas_only = false;
        let n = self.conf.sentinels.len();
        self.reached(self.ask % n);
        self.links[QUERY].conn.close();
        self.links[QUERY].peer = None;
    }

    /// `ROLE` on link `i` to `addr`: a connection made when it goes
    /// elsewhere or is down; one whose last `ROLE` is not answered fails.
    fn probe_one(&mut self, i: usize, addr: SocketAddr) {
        let link = &self.links[i];
        if link.peer != Some(addr) || link.conn.state() == State::Down {
            if i != PMASTER {
                self.probes[i - PREPLICA] = Probe {
                    addr: Some(addr),
                    ..Probe::default()
                };
            } else {
                self.offsets.clear();
            }
            let (out, due) = self.ask_role(Due::Probe);
            self.open(i, addr, out, due);
            if let Some(s) = self.links[i].conn.socket() {
                // nginx closes it when it exits (not a request's).
                s.set_idle(true);
            }
            return;
        }
        if !link.due.is_empty() {
            if i != PMASTER {
                // (The reads in flight on it go elsewhere, not waiting out
                // cache_read_timeout.)
                self.left.push((addr, "the replica stopped answering its probes"));
                self.wake.post();
            }
            return self.failed(i, "no reply to ROLE in time".to_owned());
        }
        if link.conn.is_up() {
            let link = &mut self.links[i];
            resp::command(&mut link.conn.out, &[b"ROLE"]);
            link.due.push_back(Due::Probe);
            self.run(i);
        }
    }

    /// A probe's link failed: its replica is not used until it answers.
    pub(super) fn probe_failed(&mut self, i: usize) {
        if i == PMASTER {
            self.offsets.clear();
        } else if let Some(p) = self.probes.get_mut(i - PREPLICA) {
            p.ok = false;
        }
    }

    /// `ROLE`'s answer on a probe's link.
    pub(super) fn probed(&mut self, i: usize, v: Value) {
        let now = current_msec();
        let Value::Array(a) = v else {
            return self.failed(i, "an invalid reply to ROLE".to_owned());
        };
        if i == PMASTER {
            match (is_bulk(a.first(), b"master"), a.get(1)) {
                (true, Some(Value::Integer(o))) => self.offsets.add(now, *o),
                _ => self.offsets.clear(),
            }
            return;
        }
        let master = self.master;
        let Some(p) = self.probes.get_mut(i - PREPLICA) else {
            return;
        };
        // slave, master ip, master port (an integer), state, offset.
        let port = match a.get(2) {
            Some(Value::Integer(n)) => Some(Value::Bulk(n.to_string().into_bytes())),
            other => other.cloned(),
        };
        let to = parse_addr(a.get(1), port.as_ref());
        // (Valkey may say replica where Redis says slave.)
        let replica = is_bulk(a.first(), b"slave") || is_bulk(a.first(), b"replica");
        p.ok = replica && is_bulk(a.get(3), b"connected") && to.is_some() && to == master;
        p.offset = match a.get(4) {
            Some(Value::Integer(o)) => *o,
            _ => -1,
        };
        p.at = now;
    }

    /// A replica a read may go to now (round robin over those usable with
    /// a lag of at most `max_lag`; `take`: the read goes there, the next
    /// one to the next replica).
    pub(super) fn pick_replica(&mut self, max_lag: ngx_msec_t, take: bool) -> Option<SocketAddr> {
        let now = current_msec();
        let usable: Vec<SocketAddr> = self
            .probes
            .iter()
            .filter(|p| p.ok && now.wrapping_sub(p.at) <= FRESH_MS)
            .filter(|p| self.offsets.lag(p.offset, now).is_some_and(|l| l <= max_lag))
            .filter_map(|p| p.addr)
            .collect();
        if usable.is_empty() {
            return None;
        }
        if take {
            self.turn = self.turn.wrapping_add(1);
        }
        usable.get(self.turn % usable.len()).copied()
    }

    /// A request found replica `addr` refusing or not answering: it is not
    /// used until its next `ROLE`.
    pub(super) fn replica_failed(&mut self, addr: SocketAddr) {
        for p in self.probes.iter_mut().filter(|p| p.addr == Some(addr)) {
            p.ok = false;
        }
    }
}
