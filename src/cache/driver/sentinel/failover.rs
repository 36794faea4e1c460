//! A failover as the Sentinels tell it: a replica selected (the set is
//! held), promoted, the switch; and a Sentinel that names the master a
//! switch has just left (it has not heard of the switch yet: the
//! Sentinels learn a new configuration from each other within a second or
//! two, and the old master says it is a master until it is told
//! otherwise), which is not followed back.

use std::net::SocketAddr;

use gateway_core::resp::Value;

use super::super::conn::State;
use super::reply::parse_addr;
use super::{SetState, CHECK, HOLD_MS, REFRESH_MS, RETRY_MS};
use crate::ffi::*;
use crate::log;

impl SetState {
    /// `a` is the master the last switch left, less than `HOLD_MS` ago.
    pub(super) fn just_left(&self, a: SocketAddr) -> bool {
        matches!(self.gone, Some((g, at)) if g == a && current_msec().wrapping_sub(at) < HOLD_MS)
    }

    /// The Sentinel asked named the master just left: the next one is
    /// asked next time, and the master confirmed (if any) stays.
    pub(super) fn not_told(&mut self) {
        self.ask = (self.ask + 1) % self.conf.sentinels.len();
        if self.master.is_some() {
            self.refresh.start(REFRESH_MS);
        } else {
            self.retry.start(RETRY_MS);
        }
    }

    /// `+switch-master NAME old-ip old-port new-ip new-port`.
    pub(super) fn switched(&mut self, text: &[u8]) {
        let parts: Vec<&[u8]> = text.split(|b| *b == b' ').collect();
        let [name, _, _, ip, port] = parts[..] else { return };
        if name != self.conf.name.as_slice() {
            return;
        }
        let addr = parse_addr(Some(&Value::Bulk(ip.to_vec())), Some(&Value::Bulk(port.to_vec())));
        let Some(addr) = addr else { return };
        self.held = None;
        self.hold.stop();
        if self.just_left(addr) {
            // (A switch back, told by a Sentinel: followed.)
            self.gone = None;
        }
        self.check_new(addr);
    }

    /// `addr` is the master now, the Sentinels say: checked, unless it is
    /// confirmed or being checked.
    pub(super) fn check_new(&mut self, addr: SocketAddr) {
        let checking = self.links[CHECK].conn.state() != State::Down;
        if self.master == Some(addr) || checking && self.links[CHECK].peer == Some(addr) {
            return;
        }
        self.master = None;
        self.check(addr);
    }

    /// `+selected-slave slave IP:PORT IP PORT @ NAME MASTER-IP MASTER-PORT`:
    /// a failover of the master began; it takes no more requests (what it
    /// takes from now on the promoted replica would not have).
    pub(super) fn selected(&mut self, text: &[u8]) {
        let parts: Vec<&[u8]> = text.split(|b| *b == b' ').collect();
        let [_, _, _, _, _, name, ip, port] = parts[..] else {
            return;
        };
        if name != self.conf.name.as_slice() {
            return;
        }
        let old = parse_addr(Some(&Value::Bulk(ip.to_vec())), Some(&Value::Bulk(port.to_vec())));
        let Some(old) = old else { return };
        if self.held == Some(old) {
            return;
        }
        log!(
            NGX_LOG_NOTICE,
            Log::cycle(),
            "cache: a failover of sentinel set \"{}\" of upstream \"{}\" began: requests wait for the new master",
            self.name(),
            self.conf.upstream
        );
        self.held = Some(old);
        self.hold.stop();
        self.hold.start(HOLD_MS);
        if self.master == Some(old) {
            self.master = None;
        }
    }

    /// `+promoted-slave slave IP:PORT IP PORT @ NAME MASTER-IP MASTER-PORT`:
    /// the replica is a master now; it is checked at once.
    pub(super) fn promoted(&mut self, text: &[u8]) {
        let parts: Vec<&[u8]> = text.split(|b| *b == b' ').collect();
        let [_, _, ip, port, _, name, ..] = parts[..] else {
            return;
        };
        if name != self.conf.name.as_slice() {
            return;
        }
        let addr = parse_addr(Some(&Value::Bulk(ip.to_vec())), Some(&Value::Bulk(port.to_vec())));
        let Some(addr) = addr else { return };
        self.check_new(addr);
    }
}
