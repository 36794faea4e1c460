//! A hub's connection that goes to a Sentinel set's master (`cache_subscribe`
//! and `cache_stream` to a `cache_sentinel` upstream): each connection it
//! makes goes to the master the set has confirmed then (none while none is:
//! the attempt fails, and the hub's supervisor tries again), and once the
//! set confirms another one, the connection moves there
//! (driver::follow_master, from the set's wake).

use std::net::SocketAddr;

use super::{view, SetConf};

pub struct Follow {
    conf: SetConf,
    /// The master its connection goes to (or went to last).
    at: Option<SocketAddr>,
}

impl Follow {
    pub fn new(conf: SetConf) -> Follow {
        Follow { conf, at: None }
    }

    /// The master the set has confirmed now.
    pub fn confirmed(&self) -> Option<SocketAddr> {
        view(self.conf.key, || self.conf.clone()).master
    }

    /// Where a connection made now goes: the confirmed master (Err: why
    /// there is none, for the hub's log).
    pub fn target(&mut self) -> Result<SocketAddr, String> {
        match self.confirmed() {
            Some(a) => {
                self.at = Some(a);
                Ok(a)
            }
            None => Err(format!(
                "no master of sentinel set \"{}\" is confirmed now",
                String::from_utf8_lossy(&self.conf.name)
            )),
        }
    }

    /// The confirmed master, when it is not the one the connection went to:
    /// the connection moves there.
    pub fn moved(&self) -> Option<SocketAddr> {
        self.confirmed().filter(|m| self.at != Some(*m))
    }
}
