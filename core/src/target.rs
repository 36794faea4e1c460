//! `sqldb_target`: which servers of an upstream a request may go to, by the
//! role each server reports (libpq's `target_session_attrs` vocabulary),
//! and the decisions that follow from a server's role.
//!
//! PostgreSQL 14 and later report `in_hot_standby` and
//! `default_transaction_read_only` to each session at its start and
//! whenever they change; a `Role` is what one session last heard.

use std::fmt;

/// What a request asks of the server it goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Target {
    /// Any server (the gateway does not look at roles).
    #[default]
    Any,
    /// A server that is not in hot standby.
    Primary,
    /// A server in hot standby.
    Standby,
    /// A standby when one can be had: servers whose role is not known
    /// yet are tried before a known primary (as libpq tries every host for
    /// a standby first); else any server.
    PreferStandby,
    /// Not in hot standby, and `default_transaction_read_only` off.
    ReadWrite,
    /// In hot standby, or `default_transaction_read_only` on.
    ReadOnly,
}

impl Target {
    /// The directive's values, as libpq spells them.
    pub const ALL: [(&'static str, Target); 6] = [
        ("any", Target::Any),
        ("primary", Target::Primary),
        ("standby", Target::Standby),
        ("prefer-standby", Target::PreferStandby),
        ("read-write", Target::ReadWrite),
        ("read-only", Target::ReadOnly),
    ];

    /// A value of the directive (in any letter case, as libpq reads them).
    pub fn parse(value: &[u8]) -> Option<Target> {
        Target::ALL
            .iter()
            .find(|(name, _)| name.as_bytes().eq_ignore_ascii_case(value))
            .map(|&(_, t)| t)
    }

    pub fn name(self) -> &'static str {
        Target::ALL.iter().find(|&&(_, t)| t == self).map_or("any", |&(n, _)| n)
    }

    /// The role of servers does not matter.
    pub fn is_any(self) -> bool {
        self == Target::Any
    }

    /// What a server must be, as the error log says it when none is
    /// ("no server of upstream "db" is a primary").
    pub fn wanted(self) -> &'static str {
        match self {
            Target::Any | Target::PreferStandby => "up",
            Target::Primary => "a primary",
            Target::Standby => "a standby",
            Target::ReadWrite => "read-write",
            Target::ReadOnly => "read-only",
        }
    }

    /// Whether a server of this role meets the target. `standby_hope`: a
    /// standby may yet be had, as some server of the upstream is known to
    /// be one (and up), or has a role not known yet (it may be one); that
    /// is what `prefer-standby` prefers to a server known not to be one.
    pub fn meets(self, role: Role, standby_hope: bool) -> bool {
        let standby = role.hot_standby;
        let read_only = role.read_only;
        match self {
            Target::Any => true,
            Target::Primary => standby == Some(false),
            Target::Standby => standby == Some(true),
            Target::PreferStandby => standby == Some(true) || !standby_hope,
            Target::ReadWrite => standby == Some(false) && read_only == Some(false),
            Target::ReadOnly => standby == Some(true) || read_only == Some(true),
        }
    }

    /// What the gateway does with a server the balancer offers, knowing
    /// its role or not (`standby_hope` as for `meets`).
    pub fn judge(self, role: Option<Role>, standby_hope: bool) -> Verdict {
        match role {
            _ if self.is_any() => Verdict::Meets,
            None => Verdict::Unknown,
            Some(r) if self.meets(r, standby_hope) => Verdict::Meets,
            // Only skipped because a standby may be had: the server to use
            // when it cannot.
            Some(_) => Verdict::Fails {
                fallback: self == Target::PreferStandby,
            },
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the gateway does with a server for a request's target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The server meets the target: the request goes there.
    Meets,
    /// Its role is not known (no session to it yet): a connection is opened
    /// and the role learned when it is up, before the query goes out.
    Unknown,
    /// It does not meet the target: the next server. `fallback`: it does
    /// for `prefer-standby` when the standby cannot be had.
    Fails { fallback: bool },
}

/// A server's role as one session last heard it (None: not reported,
/// as by servers before PostgreSQL 14, or a pooler in between).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Role {
    pub hot_standby: Option<bool>,
    pub read_only: Option<bool>,
}

impl Role {
    /// The role from the values of `in_hot_standby` and
    /// `default_transaction_read_only` as the server reported them.
    pub fn from_status(in_hot_standby: Option<&[u8]>, default_transaction_read_only: Option<&[u8]>) -> Role {
        Role {
            hot_standby: in_hot_standby.and_then(parse_bool),
            read_only: default_transaction_read_only.and_then(parse_bool),
        }
    }

    /// For the log: "a standby", "a primary", "a read-only primary".
    pub fn describe(self) -> &'static str {
        match (self.hot_standby, self.read_only) {
            (Some(true), _) => "a standby",
            (Some(false), Some(true)) => "a read-only primary",
            (Some(false), _) => "a primary",
            (None, _) => "a server that does not report in_hot_standby (PostgreSQL 14 or later does)",
        }
    }
}

/// A boolean setting as PostgreSQL shows it ("on"/"off"), or as it reads one.
fn parse_bool(v: &[u8]) -> Option<bool> {
    let is = |words: &[&str]| words.iter().any(|w| w.as_bytes().eq_ignore_ascii_case(v));
    if is(&["on", "true", "yes", "1"]) {
        Some(true)
    } else if is(&["off", "false", "no", "0"]) {
        Some(false)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRIMARY: Role = Role {
        hot_standby: Some(false),
        read_only: Some(false),
    };
    const READ_ONLY_PRIMARY: Role = Role {
        hot_standby: Some(false),
        read_only: Some(true),
    };
    const STANDBY: Role = Role {
        hot_standby: Some(true),
        read_only: Some(false),
    };
    const UNREPORTED: Role = Role {
        hot_standby: None,
        read_only: None,
    };

    #[test]
    fn values_parse_in_any_case_and_round_trip() {
        for (name, t) in Target::ALL {
            assert_eq!(Target::parse(name.as_bytes()), Some(t));
            assert_eq!(Target::parse(name.to_uppercase().as_bytes()), Some(t));
            assert_eq!(t.name(), name);
        }
        assert_eq!(Target::parse(b"prefer_standby"), None);
        assert_eq!(Target::parse(b""), None);
        assert_eq!(Target::parse(b"GET"), None);
        assert_eq!(Target::default(), Target::Any);
    }

    #[test]
    fn role_from_parameter_status() {
        assert_eq!(Role::from_status(Some(b"off"), Some(b"off")), PRIMARY);
        assert_eq!(Role::from_status(Some(b"on"), Some(b"off")), STANDBY);
        assert_eq!(Role::from_status(Some(b"off"), Some(b"on")), READ_ONLY_PRIMARY);
        assert_eq!(Role::from_status(None, None), UNREPORTED);
        assert_eq!(Role::from_status(Some(b"maybe"), Some(b"")), UNREPORTED);
        assert_eq!(Role::from_status(Some(b"ON"), Some(b"False")), STANDBY);
        assert_eq!(STANDBY.describe(), "a standby");
        assert_eq!(PRIMARY.describe(), "a primary");
        assert_eq!(READ_ONLY_PRIMARY.describe(), "a read-only primary");
    }

    #[test]
    fn which_role_meets_which_target() {
        use Target::*;
        // (target, primary, read-only primary, standby, unreported)
        let table = [
            (Any, [true, true, true, true]),
            (Primary, [true, true, false, false]),
            (Standby, [false, false, true, false]),
            (ReadWrite, [true, false, false, false]),
            (ReadOnly, [false, true, true, false]),
        ];
        for (t, want) in table {
            let got = [PRIMARY, READ_ONLY_PRIMARY, STANDBY, UNREPORTED].map(|r| t.meets(r, true));
            assert_eq!(got, want, "{t}");
            let got = [PRIMARY, READ_ONLY_PRIMARY, STANDBY, UNREPORTED].map(|r| t.meets(r, false));
            assert_eq!(got, want, "{t} (no standby to be had changes nothing)");
        }
    }

    #[test]
    fn prefer_standby_takes_a_standby_when_one_may_be_had_else_anything() {
        let t = Target::PreferStandby;
        assert!(t.meets(STANDBY, true));
        assert!(!t.meets(PRIMARY, true));
        assert!(!t.meets(UNREPORTED, true));
        assert!(t.meets(PRIMARY, false));
        assert!(t.meets(READ_ONLY_PRIMARY, false));
        assert!(t.meets(UNREPORTED, false));
        assert_eq!(t.judge(Some(PRIMARY), true), Verdict::Fails { fallback: true });
        assert_eq!(t.judge(Some(PRIMARY), false), Verdict::Meets);
        // A server whose role is not known yet is tried (it may be the
        // standby): a known primary is then only the fallback.
        assert_eq!(t.judge(None, true), Verdict::Unknown);
        assert_eq!(t.judge(None, false), Verdict::Unknown);
        assert_eq!(t.judge(Some(UNREPORTED), true), Verdict::Fails { fallback: true });
        assert_eq!(t.judge(Some(STANDBY), false), Verdict::Meets);
    }

    #[test]
    fn verdicts() {
        assert_eq!(Target::Any.judge(None, false), Verdict::Meets);
        assert_eq!(Target::Primary.judge(None, true), Verdict::Unknown);
        assert_eq!(
            Target::Primary.judge(Some(STANDBY), true),
            Verdict::Fails { fallback: false }
        );
        assert_eq!(Target::Standby.judge(Some(STANDBY), true), Verdict::Meets);
        assert_eq!(
            Target::ReadOnly.judge(Some(PRIMARY), false),
            Verdict::Fails { fallback: false }
        );
    }

    #[test]
    fn what_the_log_says_is_wanted() {
        assert_eq!(Target::Primary.wanted(), "a primary");
        assert_eq!(Target::Standby.wanted(), "a standby");
        assert_eq!(Target::ReadWrite.wanted(), "read-write");
        assert_eq!(Target::ReadOnly.wanted(), "read-only");
    }
}
