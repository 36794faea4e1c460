//! `cache_target master | replica | prefer-replica` and
//! `cache_replica_max_lag`: which server of a `cache_sentinel` set a
//! location's reads go to (driver::sentinel's probes say which replicas may
//! take them). Writes always go to the master.

use super::{CacheLocConf, CacheMainConf, PendingPass};
use crate::ffi::conf::ConfError;
use crate::ffi::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Master,
    Replica,
    PreferReplica,
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Master => "master",
            Target::Replica => "replica",
            Target::PreferReplica => "prefer-replica",
        }
    }
}

/// `cache_replica_max_lag`'s default (ms).
pub const MAX_LAG: ngx_msec_t = 5_000;

directive_handler! {
    /// `cache_target master | replica | prefer-replica`
    pub(crate) fn cmd_cache_target = "cmd_cache_target",
    |cf: Conf, lcf: &mut CacheLocConf| {
        if lcf.target.is_some() {
            return Err(crate::ffi::conf::duplicate("cache_target"));
        }
        let v = cf.args()[1];
        lcf.target = Some(match v {
            b"master" => Target::Master,
            b"replica" => Target::Replica,
            b"prefer-replica" => Target::PreferReplica,
            _ => {
                return Err(format!(
                    "invalid value \"{}\" in \"cache_target\" directive, it must be \"master\", \"replica\" or \"prefer-replica\"",
                    String::from_utf8_lossy(v)
                )
                .into())
            }
        });
        Ok(())
    }
}

impl CacheLocConf {
    /// The location's reads may go to replicas (its key reads: GET and
    /// HEAD; channels and streams are the master's).
    pub fn reads_replicas(&self) -> bool {
        let keyed =
            self.subscribe.is_none() && self.publish.is_none() && self.stream_add.is_none() && self.stream.is_none();
        keyed && matches!(self.target, Some(Target::Replica | Target::PreferReplica))
    }
}

/// A location whose reads may go to replicas passes to a `cache_sentinel`
/// upstream (the replicas are the Sentinels'); each such upstream's set
/// probes its replicas.
pub(super) fn check(mcf: &mut CacheMainConf, pending: &[PendingPass]) -> Result<(), ConfError> {
    for p in pending {
        // SAFETY: locations' configurations live as long as the
        // configuration; merging is over.
        let lcf: &CacheLocConf = unsafe { &*p.lcf };
        if !lcf.reads_replicas() {
            continue;
        }
        let key = p.upstream as usize;
        match mcf.sentinels.iter_mut().find(|s| s.key() == key && !s.name.is_empty()) {
            Some(s) => s.replicas = true,
            None => {
                return Err(format!(
                    "\"cache_target {}\" needs \"cache_pass\" to name an upstream of \"cache_sentinel\" (its replicas are the Sentinels'), in {}:{}",
                    lcf.target.map_or("", Target::name),
                    p.claim.file(),
                    p.claim.line()
                )
                .into())
            }
        }
    }
    Ok(())
}
