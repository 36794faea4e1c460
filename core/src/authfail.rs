//! Passwords (`cache_auth`) that Redis refused lately, per worker: a
//! request with one that was refused within the last second fails at once,
//! without a connection; once the second is over, one request tries it
//! again and the others keep failing at once until it is answered (or
//! another second is over); a refusal is logged at most once a minute per
//! password. Entries are keyed by a keyed hash of the password (and the
//! server it is for), never the password itself; the table holds at most
//! `CAPACITY` of them (the oldest refusal goes first).

use std::collections::HashMap;

/// How long after a refusal a request with the same password fails at once (ms).
pub const BLOCK_MS: u64 = 1000;

/// How often a refusal of one password is logged at most (ms).
pub const LOG_EVERY_MS: u64 = 60_000;

/// The most passwords a worker remembers (about 40 bytes each).
pub const CAPACITY: usize = 1024;

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// When it was last refused.
    refused_at: u64,
    /// When its refusal was last logged.
    logged_at: u64,
    /// When a request last went to try it again (after the block).
    tried_at: Option<u64>,
}

/// The recent refusals. Times are milliseconds of a clock that may wrap
/// (nginx's `ngx_current_msec`).
#[derive(Debug)]
pub struct AuthFailures {
    entries: HashMap<u64, Entry>,
    capacity: usize,
}

impl Default for AuthFailures {
    fn default() -> Self {
        AuthFailures::new(CAPACITY)
    }
}

impl AuthFailures {
    pub fn new(capacity: usize) -> AuthFailures {
        AuthFailures {
            entries: HashMap::new(),
            capacity: capacity.max(1),
        }
    }

    /// The password was refused less than `BLOCK_MS` ago: no connection
    /// is tried for it.
    pub fn blocked(&self, key: u64, now: u64) -> bool {
        self.entries
            .get(&key)
            .is_some_and(|e| now.wrapping_sub(e.refused_at) < BLOCK_MS)
    }

    /// Whether a new request may use the password: not while it is
    /// `blocked`, and after that only one request a `BLOCK_MS` tries it
    /// again (the first to ask); the others fail at once until it is
    /// answered (`refused` or `accepted`) or the time is over.
    pub fn may_try(&mut self, key: u64, now: u64) -> bool {
        let Some(e) = self.entries.get_mut(&key) else {
            return true;
        };
        if now.wrapping_sub(e.refused_at) < BLOCK_MS || e.tried_at.is_some_and(|t| now.wrapping_sub(t) < BLOCK_MS) {
            return false;
        }
        e.tried_at = Some(now);
        true
    }

    /// Redis refused the password. True when this refusal is to be logged
    /// (none of it was in the last `LOG_EVERY_MS`).
    pub fn refused(&mut self, key: u64, now: u64) -> bool {
        if let Some(e) = self.entries.get_mut(&key) {
            e.refused_at = now;
            e.tried_at = None;
            let due = now.wrapping_sub(e.logged_at) >= LOG_EVERY_MS;
            if due {
                e.logged_at = now;
            }
            return due;
        }
        if self.entries.len() >= self.capacity {
            // Entries past their log interval go first; then the oldest refusal.
            self.entries.retain(|_, e| now.wrapping_sub(e.logged_at) < LOG_EVERY_MS);
            if self.entries.len() >= self.capacity {
                let oldest = self
                    .entries
                    .iter()
                    .max_by_key(|(_, e)| now.wrapping_sub(e.refused_at))
                    .map(|(&k, _)| k);
                if let Some(k) = oldest {
                    self.entries.remove(&k);
                }
            }
        }
        self.entries.insert(
            key,
            Entry {
                refused_at: now,
                logged_at: now,
                tried_at: None,
            },
        );
        true
    }

    /// Redis took the password: it is forgotten.
    pub fn accepted(&mut self, key: u64) {
        self.entries.remove(&key);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_password_waits_a_second_and_is_logged_once_a_minute() {
        let mut t = AuthFailures::new(8);
        assert!(!t.blocked(1, 5));
        assert!(t.refused(1, 5));
        assert!(t.blocked(1, 5) && t.blocked(1, 1004));
        assert!(!t.blocked(1, 1005), "a second later: one more try");
        assert!(t.may_try(1, 1005), "by the first request that asks");
        assert!(
            !t.may_try(1, 1006) && !t.may_try(1, 2004),
            "and only by it, while it is out"
        );
        assert!(!t.blocked(1, 1006), "(which goes on to connect)");
        assert!(t.may_try(1, 2005), "another a second later, if it never got an answer");
        assert!(!t.blocked(2, 6) && t.may_try(2, 6), "another password is not");
        // Tried again after the second, refused again: not logged again.
        assert!(!t.refused(1, 1005));
        assert!(t.blocked(1, 2000));
        assert!(!t.refused(1, 60_004));
        assert!(t.refused(1, 60_005), "a minute after the last line");
        // Taken: forgotten.
        t.accepted(1);
        assert!(!t.blocked(1, 60_006));
        assert!(t.is_empty());
    }

    #[test]
    fn the_clock_may_wrap() {
        let mut t = AuthFailures::new(8);
        let near = u64::MAX - 10;
        assert!(t.refused(7, near));
        assert!(t.blocked(7, near.wrapping_add(500)));
        assert!(!t.blocked(7, near.wrapping_add(1000)));
    }

    #[test]
    fn the_table_is_bounded() {
        let mut t = AuthFailures::new(4);
        for k in 0..100u64 {
            assert!(t.refused(k, 10 + k), "a new password is logged");
            assert!(t.len() <= 4);
        }
        // The most recent ones are kept.
        assert!(t.blocked(99, 110) && t.blocked(96, 110));
        assert!(!t.blocked(95, 110));
        // Entries past their minute make room first.
        let mut t = AuthFailures::new(2);
        t.refused(1, 0);
        t.refused(2, 59_500);
        t.refused(3, 60_001);
        assert!(t.blocked(2, 60_001) && t.blocked(3, 60_001));
        assert_eq!(t.len(), 2);
    }
}
