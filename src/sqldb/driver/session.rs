//! The role a session keeps between requests (`sqldb_jwt_key`).
//!
//! A request with a role needs its role, its claims and, for GET and HEAD,
//! read-only transactions. Setting them again for every request costs
//! PostgreSQL a statement per request. Where the session is PostgreSQL's
//! own (no pooler between) and its login does not make it read-only, the
//! role and claims are set for the session (`set_config(..., false)`, and
//! `default_transaction_read_only` for read-only), and a connection
//! remembers what its session holds: the next request of the same role,
//! claims and read-only-ness sends nothing more; any other request sets
//! its own (a request without a role: the login's role, no claims).
//!
//! What a session holds is known only from what went through: a sync
//! segment that set it and completed without an error (an error rolls its
//! transaction back, and the settings with it). Until then it is
//! `Unknown`, and the next request sets everything it needs. A query that
//! may change the session itself (`SET`, `set_config`, several statements;
//! of a request with a role or without) makes it unknown too, and so does
//! a read-only session that reports its read-only default off (a function
//! turned it off). A role or claims a function sets for the session are
//! not reported, and not seen (docs/auth.md). Read-only is undone in a sync segment of its own
//! (`RESET default_transaction_read_only`) before the request's: a
//! transaction that began read-only cannot be made read-write once it has
//! run a query. If that segment fails, the request's transaction stays
//! read-only: never more than it may.
//!
//! Elsewhere (a pooler, a server older than 14 that does not report
//! `default_transaction_read_only`, a login that is read-only) every
//! request sets its role for its own transaction (`set_config(..., true)`).
//! A connection whose sessions are found shared after it kept a role in
//! its own puts the session back first (`RESET_SESSION`).

use std::ffi::{CStr, CString};
use std::rc::Rc;

use gateway_core::sql::statement_name;
use gateway_core::target::Role;

use super::{Query, ReqToken};

/// A statement text and the name it is prepared under.
#[derive(Debug)]
pub struct Text {
    pub sql: Rc<CString>,
    pub name: Rc<CString>,
}

impl Text {
    /// The text, named after itself (see `statement_name`).
    pub fn new(sql: String) -> Option<Text> {
        let name = CString::new(statement_name(sql.as_bytes())).ok()?;
        Some(Text {
            sql: Rc::new(CString::new(sql).ok()?),
            name: Rc::new(name),
        })
    }
}

/// The texts that keep a location's role in the session (see above):
/// the role and claims (`$1`, `$2`) with the location's `sqldb_setting`s
/// after them (for the transaction only, as always), read-write and
/// read-only; the settings alone, for a session that holds the role
/// already; and the login's role back, with the settings.
#[derive(Debug)]
pub struct SessionTexts {
    /// None for a location without a role.
    pub rw: Option<Text>,
    pub ro: Option<Text>,
    /// None without settings.
    pub settings: Option<Text>,
    pub reset: Text,
}

/// `pg_catalog.set_config` calls of `settings` settings for the
/// transaction, from parameter `$first` on.
pub fn settings_calls(settings: usize, first: usize) -> Vec<String> {
    (0..settings)
        .map(|i| {
            let n = first + 2 * i;
            format!("pg_catalog.set_config(${}, ${}, true)", n, n + 1)
        })
        .collect()
}

/// The login's role back and no claims: RESET ROLE's value (the role the
/// connection logged in with, or the one its options set).
const RESET_ROLE: &str =
    "pg_catalog.set_config('role', (select reset_val from pg_catalog.pg_settings where name = 'role'), false), \
                          pg_catalog.set_config('request.jwt.claims', '', false)";

impl SessionTexts {
    pub fn build(with_role: bool, settings: usize) -> Option<SessionTexts> {
        let select = |calls: Vec<String>| Text::new(format!("select {}", calls.join(", ")));
        let role = |read_only: bool| {
            let mut calls = vec![
                "pg_catalog.set_config('role', $1, false)".to_owned(),
                "pg_catalog.set_config('request.jwt.claims', $2, false)".to_owned(),
            ];
            if read_only {
                calls.push("pg_catalog.set_config('default_transaction_read_only', 'on', false)".to_owned());
                calls.push("pg_catalog.set_config('transaction_read_only', 'on', true)".to_owned());
            }
            calls.extend(settings_calls(settings, 3));
            select(calls)
        };
        let (rw, ro) = match with_role {
            true => (Some(role(false)?), Some(role(true)?)),
            false => (None, None),
        };
        let settings_text = match settings {
            0 => None,
            n => Some(select(settings_calls(n, 1))?),
        };
        let mut reset = vec![RESET_ROLE.to_owned()];
        reset.extend(settings_calls(settings, 1));
        Some(SessionTexts {
            rw,
            ro,
            settings: settings_text,
            reset: select(reset)?,
        })
    }
}

thread_local! {
    /// The login's role back, for a request without a preamble of its own.
    static RESET: Rc<SessionTexts> = Rc::new(SessionTexts::build(false, 0).expect("a constant text"));
}

/// What a connection's session holds of the roles the gateway sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Session {
    /// The login's role, no claims, transactions read-write (what it
    /// logged in with: nothing set, or all of it set back).
    Login,
    /// A request's role and claims, read-only or not.
    Role {
        role: CString,
        claims: CString,
        read_only: bool,
    },
    /// Being set, or set by a query of its own: not known.
    Unknown,
}

impl Session {
    /// `default_transaction_read_only` may be on.
    fn may_be_read_only(&self) -> bool {
        matches!(self, Session::Unknown | Session::Role { read_only: true, .. })
    }
}

/// What a request needs its session to hold.
#[derive(Clone, Copy)]
enum Want<'q> {
    Login,
    Role {
        role: &'q CStr,
        claims: &'q CStr,
        read_only: bool,
    },
}

impl Want<'_> {
    fn held_by(&self, s: &Session) -> bool {
        match (self, s) {
            (Want::Login, Session::Login) => true,
            (
                Want::Role {
                    role,
                    claims,
                    read_only,
                },
                Session::Role {
                    role: r,
                    claims: c,
                    read_only: ro,
                },
            ) => read_only == ro && *role == r.as_c_str() && *claims == c.as_c_str(),
            _ => false,
        }
    }

    fn session(&self) -> Session {
        match *self {
            Want::Login => Session::Login,
            Want::Role {
                role,
                claims,
                read_only,
            } => Session::Role {
                role: role.to_owned(),
                claims: claims.to_owned(),
                read_only,
            },
        }
    }
}

/// The statement sent before a request's query in its sync segment.
pub(super) struct Before<'q> {
    pub sql: Rc<CString>,
    pub name: Rc<CString>,
    /// Prepared once per connection (else unnamed).
    pub named: bool,
    pub params: &'q [CString],
}

/// What goes before a request's query.
pub(super) struct Plan<'q> {
    /// `RESET default_transaction_read_only` first, in a sync segment of
    /// its own.
    pub reset_read_only: bool,
    /// `RESET_SESSION` first, in a sync segment of its own.
    pub reset_session: bool,
    pub before: Option<Before<'q>>,
}

/// Undoes a read-only session (see above).
pub(super) const RESET_READ_ONLY: &CStr = c"RESET default_transaction_read_only";

/// Puts back all that a session kept (the login's role and read-only
/// default, no claims), for a connection that stops keeping roles in its
/// session (its sessions were found shared) while it holds one.
pub(super) const RESET_SESSION: &CStr = c"select \
    pg_catalog.set_config('role', (select reset_val from pg_catalog.pg_settings where name = 'role'), false), \
    pg_catalog.set_config('request.jwt.claims', '', false), \
    pg_catalog.set_config('default_transaction_read_only', \
        (select reset_val from pg_catalog.pg_settings where name = 'default_transaction_read_only'), false)";

/// A connection's session, as far as the roles the gateway sets go.
#[derive(Debug)]
pub struct SessionState {
    /// What it holds.
    pub holds: Session,
    /// The request whose sync segment sets it, and what it sets.
    settling: Option<(ReqToken, Session)>,
    /// `default_transaction_read_only` as the session reported it when it
    /// started (None: not reported, a server older than 14).
    login_read_only: Option<bool>,
}

impl Default for SessionState {
    fn default() -> Self {
        SessionState {
            holds: Session::Login,
            settling: None,
            login_read_only: None,
        }
    }
}

impl SessionState {
    /// Remembers the login's read-only default (`role`: what the new
    /// session reported).
    pub fn learn_login(&mut self, role: Role) {
        self.login_read_only = role.read_only;
    }

    /// The server's role as the session reports it (`reported`), but for
    /// a read-only default the gateway may have set (the login's stands for
    /// it). A session that holds the login's default, or a role's without
    /// read-only, reports the server's own (its configuration reloaded).
    pub fn server_role(&self, reported: Role) -> Role {
        let mut role = reported;
        if self.holds.may_be_read_only() {
            role.read_only = self.login_read_only.or(role.read_only);
        }
        role
    }

    /// What goes before `q`'s query; `own`: the session is PostgreSQL's
    /// own (no pooler between). The session is marked unknown while it
    /// changes (`settled` tells how that ended).
    pub(super) fn plan<'q>(&mut self, own: bool, req: ReqToken, q: &'q Query) -> Plan<'q> {
        let p = q.preamble.as_ref();
        if !(own && self.login_read_only == Some(false)) {
            // A session that kept a role while it was known to be the
            // connection's own (found shared since) is put back first.
            let reset_session = self.holds != Session::Login;
            if reset_session {
                self.holds = Session::Unknown;
                self.settling = Some((req, Session::Login));
            }
            return Plan {
                reset_read_only: false,
                reset_session,
                before: p.map(|p| Before {
                    sql: p.sql.clone(),
                    name: p.name.clone(),
                    named: p.named,
                    params: &p.params,
                }),
            };
        }
        let want = match p {
            Some(p) if p.with_role && p.params.len() >= 2 => Want::Role {
                role: &p.params[0],
                claims: &p.params[1],
                read_only: p.read_only,
            },
            _ => Want::Login,
        };
        let named = p.is_some_and(|p| p.named);
        let params: &[CString] = p.map_or(&[], |p| &p.params);
        let before = |t: &Text, params| Before {
            sql: t.sql.clone(),
            name: t.name.clone(),
            named,
            params,
        };
        let plan = if want.held_by(&self.holds) {
            // Only the settings, for the transaction.
            let settings = match want {
                Want::Role { .. } => &params[2..],
                Want::Login => params,
            };
            Plan {
                reset_read_only: false,
                reset_session: false,
                before: p.and_then(|p| p.session.settings.as_ref()).map(|t| before(t, settings)),
            }
        } else {
            // (The login's role back, for a request without a preamble.)
            let texts = p.map_or_else(|| RESET.with(Rc::clone), |p| p.session.clone());
            let text = match want {
                Want::Role { read_only: true, .. } => texts.ro.as_ref(),
                Want::Role { .. } => texts.rw.as_ref(),
                Want::Login => Some(&texts.reset),
            };
            let reset_read_only = !matches!(want, Want::Role { read_only: true, .. }) && self.holds.may_be_read_only();
            self.holds = Session::Unknown;
            self.settling = Some((req, want.session()));
            Plan {
                reset_read_only,
                reset_session: false,
                before: text.map(|t| before(t, params)),
            }
        };
        if q.changes_session {
            // Its query may change the session itself (a request without a
            // role too: its template may set a role or claims). (Several
            // statements go through `several_prefix`, not here.)
            self.holds = Session::Unknown;
            self.settling = None;
        }
        plan
    }

    /// What goes before a query of several statements (the simple
    /// protocol, no parameters): the login's role back, if the session may
    /// hold another (see above). `own` as for `plan`; `standby`: the
    /// server is a hot standby (whose transactions are all read-only).
    pub(super) fn several_prefix(&mut self, own: bool, standby: bool, req: ReqToken) -> Option<&'static str> {
        // (As for `plan`: a session keeps a role only where the login is
        // read-write; elsewhere the transaction is never made read-write.)
        let keeps = own && self.login_read_only == Some(false);
        if !keeps && self.holds == Session::Login {
            return None;
        }
        // (The transaction is made read-write before any query of its own.)
        let prefix = match &self.holds {
            Session::Login => None,
            h if keeps && h.may_be_read_only() && !standby => Some(
                "RESET default_transaction_read_only; SET TRANSACTION READ WRITE; RESET ROLE; RESET \"request.jwt.claims\"; ",
            ),
            _ => Some("RESET default_transaction_read_only; RESET ROLE; RESET \"request.jwt.claims\"; "),
        };
        // Its own statements may change the session (SET ROLE, say). (A
        // session that is not the connection's own holds the login's after
        // it: sessions found shared, see plan.)
        self.holds = Session::Unknown;
        self.settling = (!keeps).then_some((req, Session::Login));
        prefix
    }

    /// The session reported its read-only default (`reported`, after a
    /// query's results): a session that should be read-only and is not was
    /// made read-write by a query itself (a function that sets it for the
    /// session, no word of it in the template), and what it holds is not
    /// known. (With the session known, every request sent since holds it
    /// and sets nothing: the report can only be a query's.) The other way
    /// round is no danger, and may be the server's own (a configuration
    /// reloaded).
    /// (`reported` is asked only then: it costs libpq a walk of the
    /// parameters the server reported, after every result.)
    pub fn observe(&mut self, reported: impl FnOnce() -> Role) {
        if matches!(self.holds, Session::Role { read_only: true, .. }) && reported().read_only != Some(true) {
            self.holds = Session::Unknown;
            self.settling = None;
        }
    }

    /// A request's results are all in (`ok`: without an error): if it set
    /// the session, the session holds what it set.
    pub fn settled(&mut self, req: ReqToken, ok: bool) {
        if self.settling.as_ref().is_some_and(|(r, _)| *r == req) {
            if let Some((_, s)) = self.settling.take() {
                if ok {
                    self.holds = s;
                }
            }
        }
    }
}
