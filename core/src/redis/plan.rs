//! The bytes a request sends: its setup commands (`AUTH`, `PING`,
//! `SELECT`, a cluster node's `CLUSTER SLOTS` and `ASKING`), its command,
//! and what puts a kept connection back; with the reader of their replies.

use super::{ping_token, Command, Exchange, Setup, Setups};
use crate::resp;

/// One request, as the configuration and the variables give it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub command: Command,
    pub key: &'a [u8],
    pub auth: Option<&'a [u8]>,
    pub db: Option<u32>,
    pub exptime: Option<u64>,
    /// `XADD`'s trimming (`MAXLEN ~`) and its `event` field.
    pub maxlen: u64,
    pub event: Option<&'a [u8]>,
    /// A number no earlier request on the connection used: the PING token.
    pub ping: u64,
    /// To a node of a Redis Cluster: what goes before the command.
    pub cluster: Option<ClusterSteps>,
}

/// The commands a request to a Redis Cluster node may need before its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClusterSteps {
    /// `CLUSTER SLOTS`: the worker's map is missing or out of date.
    pub slots: bool,
    /// `ASKING`: the node was named by `-ASK`.
    pub asking: bool,
}

/// What to send: `head`, then (for `SET`) the request body of `body_len`
/// bytes, then `tail`; and the reader of the replies.
#[derive(Debug)]
pub struct Plan {
    pub head: Vec<u8>,
    pub tail: Vec<u8>,
    pub exchange: Exchange,
}

/// The bytes of a request and the reader for its replies.
pub fn plan(req: &Request<'_>, body_len: usize) -> Plan {
    let mut head = Vec::with_capacity(64 + req.key.len());
    let mut before = Setups::default();
    let mut after = Setups::default();
    if let Some(pw) = req.auth {
        resp::command(&mut head, &[b"AUTH", pw]);
        before.push(Setup::Auth);
    }
    // Right after AUTH: an unauthenticated PING would be refused (NOAUTH).
    let token = ping_token(req.ping);
    resp::command(&mut head, &[b"PING", &token]);
    before.push(Setup::Ping);
    let steps = req.cluster.unwrap_or_default();
    if steps.slots {
        resp::command(&mut head, &[b"CLUSTER", b"SLOTS"]);
        before.push(Setup::Slots);
    }
    if let Some(db) = req.db {
        resp::command(&mut head, &[b"SELECT", db.to_string().as_bytes()]);
        before.push(Setup::Select);
    }
    // Right before the command: ASKING holds for the next command only.
    if steps.asking {
        resp::command(&mut head, &[b"ASKING"]);
        before.push(Setup::Asking);
    }
    let mut tail = command_bytes(req, body_len, &mut head);
    // RESET also selects database 0. Not after a GET: Redis closes a
    // connection whose RESET left it unauthenticated with a large reply
    // (megabytes) still queued, cutting the value short. An authenticated
    // GET's connection is closed instead of kept.
    let authed_get = req.auth.is_some() && req.command == Command::Get;
    const RESET: &[&[u8]] = &[b"RESET"];
    const SELECT_ZERO: &[&[u8]] = &[b"SELECT", b"0"];
    let restore = if authed_get {
        None
    } else if req.auth.is_some() {
        Some((RESET, Setup::Reset))
    } else if req.db.is_some() {
        Some((SELECT_ZERO, Setup::SelectZero))
    } else {
        None
    };
    if let Some((args, setup)) = restore {
        let out = if req.command.sends_body() { &mut tail } else { &mut head };
        resp::command(out, args);
        after.push(setup);
    }
    Plan {
        head,
        tail,
        exchange: {
            let ex = Exchange::new(&before, req.command, &after)
                .with_ping(token)
                .in_cluster(req.cluster.is_some());
            if authed_get {
                ex.closing()
            } else {
                ex
            }
        },
    }
}

/// The request's own command: into `head`, up to the request body (for
/// `SET` and `PUBLISH`); what follows the body is returned.
fn command_bytes(req: &Request<'_>, body_len: usize, head: &mut Vec<u8>) -> Vec<u8> {
    let mut tail = Vec::new();
    match req.command {
        Command::Get => resp::command(head, &[b"GET", req.key]),
        Command::Del => resp::command(head, &[b"DEL", req.key]),
        Command::Publish => {
            resp::array_header(head, 3);
            resp::bulk(head, b"PUBLISH");
            resp::bulk(head, req.key);
            resp::bulk_header(head, body_len);
            tail.extend_from_slice(b"\r\n");
        }
        Command::StreamAdd => {
            tail = crate::streams::xadd(head, req.key, req.maxlen, body_len, req.event);
        }
        Command::Set => {
            resp::array_header(head, if req.exptime.is_some() { 5 } else { 3 });
            resp::bulk(head, b"SET");
            resp::bulk(head, req.key);
            resp::bulk_header(head, body_len);
            tail.extend_from_slice(b"\r\n");
            if let Some(t) = req.exptime {
                resp::bulk(&mut tail, b"EX");
                resp::bulk(&mut tail, t.to_string().as_bytes());
            }
        }
    }
    tail
}

/// A request on a shared, pipelined connection (the connection
/// authenticated itself when it opened): `PING <token>`, `SELECT` when
/// `req.db` is given (the connection's database must change), the command.
/// Nothing goes after it: the next request on the connection says what it
/// needs. `req.auth` and `req.cluster` are not used.
pub fn plan_pipelined(req: &Request<'_>, body_len: usize) -> Plan {
    let mut head = Vec::with_capacity(64 + req.key.len());
    let mut before = Setups::of(&[Setup::Ping]);
    let token = ping_token(req.ping);
    resp::command(&mut head, &[b"PING", &token]);
    if let Some(db) = req.db {
        resp::command(&mut head, &[b"SELECT", db.to_string().as_bytes()]);
        before.push(Setup::Select);
    }
    let tail = command_bytes(req, body_len, &mut head);
    Plan {
        head,
        tail,
        exchange: Exchange::new(&before, req.command, &[]).with_ping(token),
    }
}

/// Commands with no request's command after them, on a shared connection:
/// `AUTH` (when it opens), `PING <token>`, `SELECT` (to learn whether
/// Redis has that database before any command runs in it). The bytes and
/// the reader of their replies, which is done after the last of them.
pub fn plan_setup(auth: Option<&[u8]>, db: Option<u32>, ping: u64) -> (Vec<u8>, Exchange) {
    let mut out = Vec::new();
    let mut before = Setups::default();
    if let Some(pw) = auth {
        resp::command(&mut out, &[b"AUTH", pw]);
        before.push(Setup::Auth);
    }
    let token = ping_token(ping);
    resp::command(&mut out, &[b"PING", &token]);
    before.push(Setup::Ping);
    if let Some(db) = db {
        resp::command(&mut out, &[b"SELECT", db.to_string().as_bytes()]);
        before.push(Setup::Select);
    }
    let mut ex = Exchange::new(&before, Command::Get, &[]).with_ping(token);
    ex.no_command = true;
    (out, ex)
}
