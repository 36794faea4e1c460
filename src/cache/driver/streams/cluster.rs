//! A cluster's side of a stream hub: which master reads each key (the
//! worker's map), a connection per master, `-MOVED`, `CLUSTER SLOTS`.

use std::net::SocketAddr;

use gateway_core::cluster::{self as kslot, RedirectKind};
use gateway_core::resp::Value;

use super::super::hub::Addr;
use super::StreamHub;
use crate::ffi::conf::{sockaddr_bytes, socket_addr};
use crate::ffi::*;
use crate::{debug, log};

impl StreamHub {
    /// The connection of a cluster's master, made on first use.
    pub(super) fn link_of(&mut self, node: SocketAddr) -> usize {
        if let Some(j) = self.links.iter().position(|l| l.node == Some(node)) {
            return j;
        }
        let addr = Addr {
            sockaddr: sockaddr_bytes(node),
            name: node.to_string(),
        };
        self.add_link(vec![addr], Some(node))
    }

    /// Gives each key of a cluster that has no connection its master's, as
    /// the map says; asks for the map when it does not know one.
    pub(super) fn resolve(&mut self) {
        let Some(c) = self.cluster.as_ref() else {
            return;
        };
        let map = c.map.clone();
        let mut unknown = false;
        let names: Vec<String> = self
            .keys
            .iter()
            .filter(|(_, k)| k.link.is_none() && !k.held)
            .map(|(n, _)| n.clone())
            .collect();
        for name in names {
            let slot = self.keys[&name].slot;
            let owner = {
                let m = map.borrow();
                m.owner(slot).filter(|a| m.trusts(*a))
            };
            match owner {
                Some(node) => {
                    let j = self.link_of(node);
                    if let Some(k) = self.keys.get_mut(&name) {
                        k.link = Some(j);
                        k.asked = false;
                    }
                }
                None => unknown = true,
            }
        }
        if let Some(c) = self.cluster.as_mut() {
            if unknown || (map.borrow().needs_refresh() && !self.keys.is_empty()) {
                c.want_slots = true;
            }
        }
    }

    /// A `-MOVED` or `-ASK` for a cluster's key: the map learns of it and
    /// the slot's keys go where it says. A slot being migrated (`-ASK`)
    /// waits: its keys are asked again every `BLOCK_MS` until the migration
    /// is over (a `-MOVED` then), reading on from their last entries; their
    /// clients wait too (one that comes meanwhile is told it is subscribed
    /// once its key is read). True when it was one.
    pub(super) fn redirected(&mut self, i: usize, msg: &[u8]) -> bool {
        let Some(r) = kslot::parse_redirect(msg) else {
            return false;
        };
        let Some(c) = self.cluster.as_mut() else {
            return false;
        };
        let answered = self.links[i]
            .addrs
            .get(self.links[i].sup.next())
            .and_then(|a| socket_addr(&a.sockaddr));
        let ask = r.kind == RedirectKind::Ask;
        let followed = {
            let mut map = c.map.borrow_mut();
            match (r.kind, r.addr(answered)) {
                (RedirectKind::Moved, Some(to)) => map.moved(r.slot, to),
                _ => {
                    map.mark_stale();
                    false
                }
            }
        };
        c.want_slots = true;
        if ask {
            debug!(
                Log::cycle(),
                "cache: redis {} of upstream \"{}\" answered \"{r}\" for a stream: slot {} is being migrated, its keys wait",
                self.server(i),
                self.upstream,
                r.slot
            );
            self.ask_later.start(super::BLOCK_MS as ngx_msec_t);
        } else if !followed {
            // A node the map does not trust (only a seed's map names one):
            // its keys' streams end rather than ask again and again; their
            // clients come back with their last ids, to the map made
            // meanwhile.
            log!(
                NGX_LOG_ERR,
                Log::cycle(),
                "cache: redis {} of upstream \"{}\" answered \"{r}\" for a stream; the streams of slot {} end",
                self.server(i),
                self.upstream,
                r.slot
            );
            let who: Vec<_> = self
                .keys
                .values()
                .filter(|k| k.slot == r.slot)
                .flat_map(|k| k.subs.iter().copied())
                .collect();
            self.sink.fail(&who, HTTP_BAD_GATEWAY);
        }
        for k in self.keys.values_mut().filter(|k| k.slot == r.slot) {
            k.link = None;
            k.asked = false;
            k.held = ask;
        }
        let keys = &self.keys;
        for cu in &mut self.catchups {
            if keys.get(&cu.key).is_some_and(|k| k.slot == r.slot) {
                cu.asked = false;
            }
        }
        true
    }

    /// The seed's `CLUSTER SLOTS`: the worker's map is made again from it.
    pub(super) fn slots_answer(&mut self, i: usize, v: &Value) {
        if let Some(c) = self.cluster.as_mut() {
            c.asked_slots = false;
            let answered = self.links[i]
                .addrs
                .get(self.links[i].sup.next())
                .and_then(|a| socket_addr(&a.sockaddr));
            let rebuilt = match (kslot::parse_slots(v), answered) {
                (Ok(ranges), Some(a)) => c.map.borrow_mut().rebuild(&ranges, a).map_err(|e| e.to_string()),
                (Err(e), _) => Err(e.to_string()),
                (_, None) => Err("no address".to_owned()),
            };
            if let Err(why) = rebuilt {
                log!(
                    NGX_LOG_ERR,
                    Log::cycle(),
                    "cache: redis {} of upstream \"{}\" gave no map of the cluster for its streams: {why}",
                    self.server(i),
                    self.upstream
                );
            }
        }
    }
}
