//! One cache request's exchange with Redis, without any I/O: the bytes it
//! sends and a reader of the replies that come back.
//!
//! A request may need the connection set up for it (`AUTH`, `SELECT`)
//! before its command, and then puts the connection back the way a pooled
//! connection must be, for the next request (`RESET` after `AUTH`,
//! `SELECT 0` after `SELECT`). Every reply is read to its exact end; only
//! then can the connection be reused.
//!
//! Every request's commands start with `PING <token>` (after `AUTH`, which
//! Redis wants before anything else on a server with a password), the token
//! the request's own, and the reader takes nothing as a reply of the
//! request before the echo of that token: bytes that the server sent after
//! the previous request's last reply, which arrive once a pooled connection
//! has been picked by the next request, are never read as that request's
//! answer, even when they look like a reply to PING.

mod plan;

use std::fmt;

pub use plan::{plan, plan_pipelined, plan_setup, ClusterSteps, Plan, Request};

use crate::cluster::{self, Redirect};
use crate::resp::{self, Reply, Value};

/// What the request asks of Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Get,
    Set,
    Del,
    /// `PUBLISH channel body` (`cache_publish`; the key is the channel).
    Publish,
    /// `XADD key MAXLEN ~ N * data body [event e]` (`cache_stream_add`).
    StreamAdd,
}

impl Command {
    /// The request body goes out as the command's last argument.
    pub fn sends_body(self) -> bool {
        matches!(self, Command::Set | Command::Publish | Command::StreamAdd)
    }

    pub fn name(self) -> &'static str {
        match self {
            Command::Get => "GET",
            Command::Set => "SET",
            Command::Del => "DEL",
            Command::Publish => "PUBLISH",
            Command::StreamAdd => "XADD",
        }
    }
}

/// Commands around the request's own, for the connection's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    Auth,
    /// `PING <token>`: the echo of its token marks where the request's
    /// own replies start.
    Ping,
    Select,
    /// `SELECT 0` after the request's own `SELECT`.
    SelectZero,
    /// `RESET` after `AUTH`: back to the default user and database 0.
    Reset,
    /// `CLUSTER SLOTS`: the map of a Redis Cluster, in the same round trip.
    Slots,
    /// `ASKING` right before the command, after `-ASK`.
    Asking,
}

/// The setup commands before or after a request's own, in order, kept
/// inline: every request has an exchange, and no allocation for the two or
/// three commands it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setups {
    items: [Setup; Setups::MAX],
    len: u8,
}

impl Setups {
    /// More than a request ever has (AUTH, PING, CLUSTER SLOTS, SELECT,
    /// ASKING before; SELECT 0 or RESET after).
    pub const MAX: usize = 8;

    pub fn of(list: &[Setup]) -> Setups {
        let mut s = Setups::default();
        for &setup in list {
            s.push(setup);
        }
        s
    }

    pub fn push(&mut self, setup: Setup) {
        assert!(
            (self.len as usize) < Setups::MAX,
            "more setup commands than a request has"
        );
        self.items[self.len as usize] = setup;
        self.len += 1;
    }
}

impl Default for Setups {
    fn default() -> Setups {
        Setups {
            items: [Setup::Ping; Setups::MAX],
            len: 0,
        }
    }
}

impl std::ops::Deref for Setups {
    type Target = [Setup];
    fn deref(&self) -> &[Setup] {
        &self.items[..self.len as usize]
    }
}

impl Setup {
    pub fn name(self) -> &'static str {
        match self {
            Setup::Auth => "AUTH",
            Setup::Ping => "PING",
            Setup::Select | Setup::SelectZero => "SELECT",
            Setup::Reset => "RESET",
            Setup::Slots => "CLUSTER SLOTS",
            Setup::Asking => "ASKING",
        }
    }
}

/// A value of `$cache_db` or `$cache_exptime` that is not a number in range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadNumber;

/// The largest database number: Redis's `SELECT` takes an int.
pub const MAX_DB: u32 = i32::MAX as u32;

/// `$cache_db`: a database number, 0 to `MAX_DB`; 0 needs no `SELECT`.
pub fn parse_db(v: &[u8]) -> Result<Option<u32>, BadNumber> {
    let n = parse_digits(v).filter(|&n| n <= u64::from(MAX_DB)).ok_or(BadNumber)?;
    Ok((n != 0).then_some(n as u32))
}

/// `$cache_exptime`: seconds; 0 means no expiry (as memcached has it).
/// Redis refuses more than its millisecond clock can hold.
pub fn parse_exptime(v: &[u8]) -> Result<Option<u64>, BadNumber> {
    let n = parse_digits(v)
        .filter(|&n| n <= i64::MAX as u64 / 1000)
        .ok_or(BadNumber)?;
    Ok((n != 0).then_some(n))
}

fn parse_digits(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 20 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// Whether `cache_escape_key` writes a byte of a key escaped: the control
/// bytes (0x00 to 0x1F), space and `%`, the bytes nginx's memcached module
/// escapes in its keys (`ngx_escape_uri` with `NGX_ESCAPE_MEMCACHED`).
pub fn escaped_in_key(b: u8) -> bool {
    b <= b' ' || b == b'%'
}

/// A key as `cache_escape_key on` sends it: each byte `escaped_in_key`
/// names becomes `%` and two upper-case hex digits, as nginx writes them;
/// the others stay. `%` being one of them, two keys never escape to the
/// same bytes.
pub fn escape_key(key: Vec<u8>) -> Vec<u8> {
    let n = key.iter().filter(|&&b| escaped_in_key(b)).count();
    if n == 0 {
        return key;
    }
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = Vec::with_capacity(key.len() + 2 * n);
    for b in key {
        if escaped_in_key(b) {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0x0f)]]);
        } else {
            out.push(b);
        }
    }
    out
}

/// The longest `CLUSTER SLOTS` reply read (a cluster of hundreds of
/// masters with fragmented slot ranges stays far below it).
pub const MAX_SLOTS_REPLY: usize = 4 * 1024 * 1024;

/// The longest reply to `XADD` read (an ID is 41 bytes at most).
const STREAM_ID_REPLY_MAX: usize = 64;

/// The length of a PING token (a u64 in hex).
pub const PING_TOKEN_LEN: usize = 16;

/// The token of `PING <token>` for a request's number.
pub fn ping_token(n: u64) -> [u8; PING_TOKEN_LEN] {
    let mut t = [0u8; PING_TOKEN_LEN];
    for (i, b) in t.iter_mut().enumerate() {
        *b = b"0123456789abcdef"[((n >> (60 - 4 * i)) & 0xf) as usize];
    }
    t
}

/// Why the replies cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyError {
    /// An error reply to a setup command (a wrong password, a database out of range).
    Refused { setup: Setup, message: Vec<u8> },
    /// An error reply to the command (`WRONGTYPE`, `NOAUTH`, `OOM`).
    Failed { command: Command, message: Vec<u8> },
    /// A reply of a kind that does not answer the command.
    Unexpected { what: &'static str },
    /// Bytes that are not RESP.
    NotResp { what: &'static str },
    /// A bulk length over `MAX_BULK`.
    TooLong(u64),
    /// The value is not followed by its CRLF.
    BadValueEnd,
    /// Bytes after the last reply that nothing asked for.
    Unsolicited,
    /// A reply where PING's echo was due: bytes the server sent before it read
    /// this request's commands (left from before on a pooled connection).
    /// The header line that came, at most `STALE_SHOWN` bytes of it.
    Stale(Vec<u8>),
}

/// How much of a stale reply's header line an error keeps (for the log).
pub const STALE_SHOWN: usize = 32;

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplyError::Refused { setup, message } => {
                write!(f, "{} was refused: {}", setup.name(), String::from_utf8_lossy(message))
            }
            ReplyError::Failed { command, message } => write!(
                f,
                "redis answered {} with an error: {}",
                command.name(),
                String::from_utf8_lossy(message)
            ),
            ReplyError::Unexpected { what } | ReplyError::NotResp { what } => {
                write!(f, "redis sent an invalid reply to {what}")
            }
            ReplyError::TooLong(n) => write!(
                f,
                "redis sent a value length of {n} bytes, more than {} allowed",
                resp::MAX_BULK
            ),
            ReplyError::BadValueEnd => f.write_str("redis sent an invalid end of value"),
            ReplyError::Unsolicited => f.write_str("redis sent bytes that no command asked for"),
            ReplyError::Stale(line) => write!(
                f,
                "redis sent \"{}\" where the echo of PING was due: bytes that are not this request's replies (left on a kept connection, or sent unasked)",
                line.escape_ascii()
            ),
        }
    }
}

impl std::error::Error for ReplyError {}

impl ReplyError {
    /// Bytes no working Redis node sends (not RESP, a reply of the wrong
    /// kind, lengths or ends that do not hold, replies nobody asked for),
    /// or a cluster step refused: with a Redis Cluster, the node may not be
    /// what the map says, so the map is out of date. Error replies to the
    /// command and a refused `AUTH` (the client's or the configuration's
    /// doing) are not.
    pub fn breaks_protocol(&self) -> bool {
        match self {
            ReplyError::Refused { setup, .. } => matches!(setup, Setup::Slots | Setup::Asking),
            ReplyError::Failed { .. } => false,
            ReplyError::Unexpected { .. }
            | ReplyError::NotResp { .. }
            | ReplyError::TooLong(_)
            | ReplyError::BadValueEnd
            | ReplyError::Unsolicited
            | ReplyError::Stale(_) => true,
        }
    }
}

/// The error codes of a server that cannot take a command now, whatever
/// the command: a replica (`READONLY`, to a write), one loading its data
/// (`LOADING`), a replica cut off from its master that serves no stale
/// data (`MASTERDOWN`). The command has not run, and another server (a
/// master, a promoted replica) may take it.
const NOT_NOW: [&[u8]; 3] = [b"READONLY", b"LOADING", b"MASTERDOWN"];

impl ReplyError {
    /// An error reply to the command that says the server cannot take it
    /// now (`NOT_NOW`): a state of the server, not its failure, and not
    /// the answer to the command either.
    pub fn not_now(&self) -> bool {
        match self {
            ReplyError::Failed { message, .. } => {
                let code = message.split(|&b| b == b' ').next().unwrap_or_default();
                NOT_NOW.contains(&code)
            }
            _ => false,
        }
    }

    /// The master refused a write because too few replicas are in step
    /// with it (`NOREPLICAS`, its `min-replicas-to-write`): nothing was
    /// written, and it may take the write once they are.
    pub fn no_replicas(&self) -> bool {
        matches!(self, ReplyError::Failed { message, .. }
            if message.split(|&b| b == b' ').next() == Some(&b"NOREPLICAS"[..]))
    }
}

/// What reading the replies gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event<'a> {
    /// More bytes are needed. Bytes not consumed (a partial reply line)
    /// must be given again, followed by the next ones.
    More,
    /// The command's reply: the HTTP status and, for a value, its length.
    Answer { status: u16, value: Option<u64> },
    /// Bytes of the value (they are within the input).
    Value(&'a [u8]),
    /// The reply to `CLUSTER SLOTS` (an array), read whole.
    Slots(Value),
    /// The command's reply is `-MOVED` or `-ASK` (to a cluster node): the
    /// command must go to another node. Nothing of the reply goes to the
    /// client; the replies after it are still read.
    Redirect(Redirect),
    /// Every reply is read, to its exact end: the connection can be reused.
    Done,
    /// The exchange is broken: the connection must not be reused.
    Failed(ReplyError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Replies of the setup commands before the command (index into `before`).
    Before(usize),
    Command,
    /// Value bytes still to come, then the CRLF bytes still to come.
    Value {
        rest: u64,
        crlf: u8,
    },
    /// Replies of the commands after (index into `after`).
    After(usize),
    Done,
    Failed,
}

/// Reads the replies of one request, in order, as bytes arrive in any pieces.
#[derive(Debug, Clone)]
pub struct Exchange {
    before: Setups,
    command: Command,
    after: Setups,
    phase: Phase,
    /// The token of its PING.
    ping: [u8; PING_TOKEN_LEN],
    /// To a cluster node: `-MOVED` and `-ASK` are redirections.
    cluster: bool,
    /// The part of the `CLUSTER SLOTS` reply read so far.
    slots: Vec<u8>,
    /// The connection may be kept once the exchange is done (false: it
    /// is left authenticated, and closes).
    keep: bool,
    /// The integer that answered the command (`PUBLISH`: its receivers).
    count: Option<i64>,
    /// The ID that answered `XADD`.
    id: Option<Vec<u8>>,
    /// Setup commands only (`plan_setup`): done after the last of them.
    no_command: bool,
}

impl Exchange {
    pub fn new(before: &[Setup], command: Command, after: &[Setup]) -> Exchange {
        let phase = if before.is_empty() {
            Phase::Command
        } else {
            Phase::Before(0)
        };
        Exchange {
            before: Setups::of(before),
            command,
            after: Setups::of(after),
            phase,
            ping: ping_token(0),
            cluster: false,
            slots: Vec::new(),
            keep: true,
            count: None,
            id: None,
            no_command: false,
        }
    }

    /// The connection closes after the exchange (it is not reset).
    pub fn closing(mut self) -> Exchange {
        self.keep = false;
        self
    }

    /// The connection may go back to the pool once the exchange is done.
    pub fn keeps(&self) -> bool {
        self.keep
    }

    /// The command goes to a Redis Cluster node.
    pub fn in_cluster(mut self, on: bool) -> Exchange {
        self.cluster = on;
        self
    }

    /// The token its PING carries (the reply to PING must echo it).
    pub fn with_ping(mut self, token: [u8; PING_TOKEN_LEN]) -> Exchange {
        self.ping = token;
        self
    }

    /// Back to the first reply (the request is sent again, to another server).
    pub fn restart(&mut self) {
        self.slots.clear();
        self.count = None;
        self.id = None;
        self.phase = if self.before.is_empty() {
            Phase::Command
        } else {
            Phase::Before(0)
        };
    }

    /// The integer reply to the command, once it is read (`PUBLISH`).
    pub fn count(&self) -> Option<i64> {
        self.count
    }

    /// The body of an answer made here, once its reply is read: JSON of
    /// `PUBLISH`'s receivers or of `XADD`'s ID.
    pub fn answer_body(&self) -> Option<Vec<u8>> {
        match (self.count, &self.id) {
            (Some(n), _) => Some(crate::pubsub::receivers_json(n)),
            (None, Some(id)) => Some(crate::streams::id_json(id)),
            (None, None) => None,
        }
    }

    /// Every reply has been read to its end.
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// More bytes belong to this exchange (it has neither ended nor failed).
    pub fn expects_more(&self) -> bool {
        !matches!(self.phase, Phase::Done | Phase::Failed)
    }

    /// The command's reply is known (what follows is its value or the
    /// replies after it).
    pub fn answered(&self) -> bool {
        matches!(self.phase, Phase::Value { .. } | Phase::After(_) | Phase::Done)
    }

    /// Looks ahead, without reading: within a value, whether the bytes of
    /// `buf` (what follows in the stream) end it with its CRLF, as far as
    /// they go. `Err(BadValueEnd)` when they cannot: the value is
    /// malformed, and known to be so before any of it is passed on. (The
    /// events of `step` do not change: they stay the same however the
    /// bytes are cut.)
    pub fn check_value_end(&self, buf: &[u8]) -> Result<(), ReplyError> {
        let Phase::Value { rest, crlf } = self.phase else {
            return Ok(());
        };
        let Some(after) = usize::try_from(rest).ok().and_then(|r| buf.get(r..)) else {
            return Ok(());
        };
        let want = &b"\r\n"[2 - crlf as usize..];
        let n = want.len().min(after.len());
        if after[..n] == want[..n] {
            Ok(())
        } else {
            Err(ReplyError::BadValueEnd)
        }
    }

    /// Takes bytes from the start of `buf`: the event and how many bytes it
    /// used. Replies that need no action (setup commands, the CRLF after a
    /// value) are read on the way; `More` means every whole reply line is
    /// used and what is left is the start of the next one.
    pub fn step<'a>(&mut self, buf: &'a [u8]) -> (Event<'a>, usize) {
        let mut used = 0;
        loop {
            let before = self.phase;
            let (event, n) = self.step_once(&buf[used..]);
            used += n;
            let silent = event == Event::More && n > 0 && before != self.phase;
            if !silent {
                return (event, used);
            }
        }
    }

    fn step_once<'a>(&mut self, buf: &'a [u8]) -> (Event<'a>, usize) {
        match self.phase {
            Phase::Done if buf.is_empty() => (Event::Done, 0),
            Phase::Done | Phase::Failed => self.fail(ReplyError::Unsolicited),
            Phase::Value { rest, crlf } => self.value(buf, rest, crlf),
            Phase::Before(i) => {
                let setup = self.before[i];
                self.setup_reply(buf, setup, |ex| {
                    ex.phase = if i + 1 < ex.before.len() {
                        Phase::Before(i + 1)
                    } else if ex.no_command {
                        Phase::Done
                    } else {
                        Phase::Command
                    }
                })
            }
            Phase::After(i) => {
                let setup = self.after[i];
                self.setup_reply(buf, setup, |ex| {
                    ex.phase = if i + 1 < ex.after.len() {
                        Phase::After(i + 1)
                    } else {
                        Phase::Done
                    }
                })
            }
            Phase::Command => self.command_reply(buf),
        }
    }

    fn fail<'a>(&mut self, e: ReplyError) -> (Event<'a>, usize) {
        self.phase = Phase::Failed;
        (Event::Failed(e), 0)
    }

    /// After the command's reply and its value: the replies after, or the end.
    fn after_command(&mut self) {
        self.phase = if self.after.is_empty() {
            Phase::Done
        } else {
            Phase::After(0)
        };
    }

    /// The reply to `PING <token>`: exactly the bulk `$16\r\n<token>\r\n`.
    /// Anything else is bytes from before (errors and garbage are said as
    /// such), decided once its header line is whole, so that how the bytes
    /// are cut never changes the outcome.
    fn ping_reply<'a>(&mut self, buf: &'a [u8], next: impl FnOnce(&mut Self)) -> (Event<'a>, usize) {
        // `$16\r\n`, the token, CRLF (on the stack: one per request).
        const _: () = assert!(PING_TOKEN_LEN == 16);
        let mut want = [0u8; PING_TOKEN_LEN + 7];
        want[..5].copy_from_slice(b"$16\r\n");
        want[5..5 + PING_TOKEN_LEN].copy_from_slice(&self.ping);
        want[5 + PING_TOKEN_LEN..].copy_from_slice(b"\r\n");
        let n = want.len().min(buf.len());
        if buf[..n] == want[..n] {
            if n < want.len() {
                return (Event::More, 0);
            }
            next(self);
            return if self.phase == Phase::Done {
                (Event::Done, n)
            } else {
                (Event::More, n)
            };
        }
        match resp::reply_header(buf) {
            (Reply::Incomplete, _) => (Event::More, 0),
            (Reply::Error(msg), _) => self.fail(ReplyError::Refused {
                setup: Setup::Ping,
                message: msg.to_vec(),
            }),
            (Reply::Invalid, _) => self.fail(ReplyError::NotResp { what: "PING" }),
            (Reply::TooLong(n), _) => self.fail(ReplyError::TooLong(n)),
            _ => self.stale(buf),
        }
    }

    fn setup_reply<'a>(&mut self, buf: &'a [u8], setup: Setup, next: impl FnOnce(&mut Self)) -> (Event<'a>, usize) {
        let what = setup.name();
        if setup == Setup::Ping {
            return self.ping_reply(buf, next);
        }
        if setup == Setup::Slots {
            return self.slots_reply(buf, next);
        }
        match resp::reply_header(buf) {
            (Reply::Incomplete, _) => (Event::More, 0),
            (Reply::Status(_), used) => {
                next(self);
                if self.phase == Phase::Done {
                    (Event::Done, used)
                } else {
                    (Event::More, used)
                }
            }
            (Reply::Error(msg), _) => self.fail(ReplyError::Refused {
                setup,
                message: msg.to_vec(),
            }),
            (Reply::Invalid, _) => self.fail(ReplyError::NotResp { what }),
            (Reply::TooLong(n), _) => self.fail(ReplyError::TooLong(n)),
            (_, _) => self.fail(ReplyError::Unexpected { what }),
        }
    }

    /// The reply to `CLUSTER SLOTS`, which can be longer than any buffer:
    /// its bytes are kept here as they come (all input is used) until it
    /// is whole.
    fn slots_reply<'a>(&mut self, buf: &'a [u8], next: impl FnOnce(&mut Self)) -> (Event<'a>, usize) {
        let what = Setup::Slots.name();
        let before = self.slots.len();
        let take = buf.len().min(MAX_SLOTS_REPLY + 1 - before.min(MAX_SLOTS_REPLY));
        self.slots.extend_from_slice(&buf[..take]);
        match resp::value(&self.slots, MAX_SLOTS_REPLY) {
            Ok(None) => (Event::More, take),
            Ok(Some((v, len))) => {
                self.slots.clear();
                let used = len - before;
                match v {
                    Value::Array(_) => {
                        next(self);
                        (Event::Slots(v), used)
                    }
                    Value::Error(message) => self.fail(ReplyError::Refused {
                        setup: Setup::Slots,
                        message,
                    }),
                    _ => self.fail(ReplyError::Unexpected { what }),
                }
            }
            Err(resp::NotResp) => {
                self.slots.clear();
                self.fail(ReplyError::NotResp { what })
            }
        }
    }

    /// A reply where the echo of PING's token was due, its header line at
    /// the start of `buf`.
    fn stale<'a>(&mut self, buf: &[u8]) -> (Event<'a>, usize) {
        let line = buf.split(|&b| b == b'\r').next().unwrap_or_default();
        self.fail(ReplyError::Stale(line[..line.len().min(STALE_SHOWN)].to_vec()))
    }

    fn command_reply<'a>(&mut self, buf: &'a [u8]) -> (Event<'a>, usize) {
        let command = self.command;
        let what = command.name();
        let (reply, used) = resp::reply_header(buf);
        let (status, value) = match (command, reply) {
            (_, Reply::Incomplete) => return (Event::More, 0),
            (Command::Get, Reply::Bulk(n)) => (200, Some(n)),
            (Command::Get, Reply::Nil) => (404, None),
            (Command::Set, Reply::Status(s)) if s == b"OK" => (201, None),
            (Command::Del, Reply::Integer(n)) => (if n > 0 { 204 } else { 404 }, None),
            (Command::Publish, Reply::Integer(n)) => {
                self.count = Some(n);
                (200, None)
            }
            (Command::StreamAdd, Reply::Bulk(_)) => match resp::value(buf, STREAM_ID_REPLY_MAX) {
                Ok(None) => return (Event::More, 0),
                Ok(Some((Value::Bulk(id), all))) => {
                    self.id = Some(id);
                    self.after_command();
                    return (
                        Event::Answer {
                            status: 201,
                            value: None,
                        },
                        all,
                    );
                }
                _ => return self.fail(ReplyError::Unexpected { what }),
            },
            (_, Reply::Error(msg)) if self.cluster && cluster::parse_redirect(msg).is_some() => {
                let redirect = cluster::parse_redirect(msg);
                self.after_command();
                return match redirect {
                    Some(r) => (Event::Redirect(r), used),
                    None => self.fail(ReplyError::Unexpected { what }),
                };
            }
            (_, Reply::Error(msg)) => {
                return self.fail(ReplyError::Failed {
                    command,
                    message: msg.to_vec(),
                })
            }
            (_, Reply::Invalid) => return self.fail(ReplyError::NotResp { what }),
            (_, Reply::TooLong(n)) => return self.fail(ReplyError::TooLong(n)),
            (_, _) => return self.fail(ReplyError::Unexpected { what }),
        };
        match value {
            Some(n) => self.phase = Phase::Value { rest: n, crlf: 2 },
            None => self.after_command(),
        }
        (Event::Answer { status, value }, used)
    }

    fn value<'a>(&mut self, buf: &'a [u8], rest: u64, crlf: u8) -> (Event<'a>, usize) {
        if rest > 0 {
            if buf.is_empty() {
                return (Event::More, 0);
            }
            let n = usize::try_from(rest).map_or(buf.len(), |r| r.min(buf.len()));
            self.phase = Phase::Value {
                rest: rest - n as u64,
                crlf,
            };
            return (Event::Value(&buf[..n]), n);
        }
        let want = &b"\r\n"[2 - crlf as usize..];
        let n = want.len().min(buf.len());
        if buf[..n] != want[..n] {
            return self.fail(ReplyError::BadValueEnd);
        }
        if n < want.len() {
            self.phase = Phase::Value {
                rest: 0,
                crlf: crlf - n as u8,
            };
            return (Event::More, n);
        }
        self.after_command();
        let event = if self.phase == Phase::Done {
            Event::Done
        } else {
            Event::More
        };
        (event, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// nginx's own table for memcached keys (ngx_string.c), a bit per
    /// byte, 32 bytes a word.
    const NGINX_MEMCACHED: [u32; 8] = [0xffffffff, 0x00000021, 0, 0, 0, 0, 0, 0];

    #[test]
    fn the_bytes_escaped_in_keys_are_nginx_memcached_ones() {
        for b in 0..=255u8 {
            let nginx = NGINX_MEMCACHED[usize::from(b >> 5)] & (1 << (b & 0x1f)) != 0;
            assert_eq!(escaped_in_key(b), nginx, "byte {b:#04x}");
        }
    }

    #[test]
    fn keys_escaped() {
        for (key, sent) in [
            (&b"/file sp"[..], &b"/file%20sp"[..]),
            (b"/file%20sp", b"/file%2520sp"),
            (b"a\r\nb\x00\x1f\x7f", b"a%0D%0Ab%00%1F\x7f"),
            (b"caf\xc3\xa9", b"caf\xc3\xa9"),
            (b"plain/{tag}:key", b"plain/{tag}:key"),
            (b"", b""),
        ] {
            assert_eq!(escape_key(key.to_vec()), sent.to_vec(), "{}", key.escape_ascii());
        }
    }

    /// Escaped keys decode to the key they came from: no two keys share an
    /// escaped form, and no byte of the set is left in it.
    #[test]
    fn escaped_keys_decode_to_their_key() {
        let mut rng = crate::testrng::TestRng::new(27);
        for _ in 0..2000 {
            let len = rng.index(24);
            let key: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
            let sent = escape_key(key.clone());
            assert!(sent.iter().all(|&b| b == b'%' || !escaped_in_key(b)));
            let mut back = Vec::new();
            let mut i = 0;
            while i < sent.len() {
                if sent[i] == b'%' {
                    let hex = std::str::from_utf8(&sent[i + 1..i + 3]).unwrap();
                    back.push(u8::from_str_radix(hex, 16).unwrap());
                    i += 3;
                } else {
                    back.push(sent[i]);
                    i += 1;
                }
            }
            assert_eq!(back, key);
        }
    }

    #[test]
    fn replies_that_break_the_protocol() {
        for e in [
            ReplyError::NotResp { what: "GET" },
            ReplyError::Unexpected { what: "GET" },
            ReplyError::TooLong(1 << 40),
            ReplyError::BadValueEnd,
            ReplyError::Unsolicited,
            ReplyError::Stale(b"+OK".to_vec()),
            ReplyError::Refused {
                setup: Setup::Slots,
                message: b"ERR no".to_vec(),
            },
        ] {
            assert!(e.breaks_protocol(), "{e}");
        }
        for e in [
            ReplyError::Refused {
                setup: Setup::Auth,
                message: b"WRONGPASS".to_vec(),
            },
            ReplyError::Failed {
                command: Command::Get,
                message: b"WRONGTYPE".to_vec(),
            },
        ] {
            assert!(!e.breaks_protocol(), "{e}");
        }
    }

    #[test]
    fn replies_of_a_server_that_cannot_take_the_command_now() {
        let failed = |m: &[u8]| ReplyError::Failed {
            command: Command::Set,
            message: m.to_vec(),
        };
        for m in [
            &b"READONLY You can't write against a read only replica."[..],
            b"LOADING Redis is loading the dataset in memory",
            b"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
            b"READONLY",
        ] {
            assert!(failed(m).not_now(), "{}", m.escape_ascii());
        }
        for m in [
            &b"WRONGTYPE Operation against a key holding the wrong kind of value"[..],
            b"ERR unknown command",
            b"READONLYX",
            b"OOM command not allowed",
            b"",
        ] {
            assert!(!failed(m).not_now(), "{}", m.escape_ascii());
        }
        let setup = ReplyError::Refused {
            setup: Setup::Auth,
            message: b"LOADING".to_vec(),
        };
        assert!(!setup.not_now());
        assert!(failed(b"NOREPLICAS Not enough good replicas to write.").no_replicas());
        assert!(!failed(b"NOREPLICAS Not enough good replicas to write.").not_now());
        for m in [&b"NOREPLICASX"[..], b"READONLY", b"ERR NOREPLICAS", b""] {
            assert!(!failed(m).no_replicas(), "{}", m.escape_ascii());
        }
        let refused = ReplyError::Refused {
            setup: Setup::Auth,
            message: b"NOREPLICAS".to_vec(),
        };
        assert!(!refused.no_replicas());
    }

    fn req(command: Command) -> Request<'static> {
        Request {
            command,
            key: b"k",
            auth: None,
            db: None,
            exptime: None,
            maxlen: 0,
            event: None,
            ping: 7,
            cluster: None,
        }
    }

    /// The reply to the PING of `req`'s requests.
    const ECHO: &[u8] = b"$16\r\n0000000000000007\r\n";

    /// Feeds `input` in pieces of `piece` bytes, keeping unconsumed bytes
    /// as a caller must; returns the events (values joined) and the rest.
    fn run(ex: &mut Exchange, input: &[u8], piece: usize) -> (Vec<String>, Vec<u8>) {
        let mut events = Vec::new();
        let mut pending: Vec<u8> = Vec::new();
        let mut value = Vec::new();
        for chunk in input.chunks(piece.max(1)) {
            pending.extend_from_slice(chunk);
            loop {
                let (ev, used) = ex.step(&pending);
                let done = match &ev {
                    Event::More => true,
                    Event::Value(v) => {
                        value.extend_from_slice(v);
                        false
                    }
                    Event::Answer { status, value } => {
                        events.push(format!("answer {status} {value:?}"));
                        false
                    }
                    Event::Done => {
                        events.push("done".into());
                        // Bytes after the end are for the next step to refuse.
                        used == pending.len()
                    }
                    Event::Failed(e) => {
                        events.push(format!("failed {e}"));
                        true
                    }
                    Event::Slots(_) => {
                        events.push("slots".into());
                        false
                    }
                    Event::Redirect(r) => {
                        events.push(format!("redirect {r}"));
                        false
                    }
                };
                pending.drain(..used);
                if done {
                    break;
                }
            }
            if ex.phase == Phase::Failed {
                break;
            }
        }
        if !value.is_empty() {
            events.push(format!("value {}", String::from_utf8_lossy(&value)));
        }
        (events, pending)
    }

    #[test]
    fn plans_send_what_redis_expects() {
        let p = plan(&req(Command::Get), 0);
        assert_eq!(
            p.head,
            [&b"*2\r\n$4\r\nPING\r\n"[..], ECHO, b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"].concat()
        );
        assert!(p.tail.is_empty());
        let p = plan(
            &Request {
                auth: Some(b"pw"),
                db: Some(3),
                ..req(Command::Del)
            },
            0,
        );
        let mut want = Vec::new();
        resp::command(&mut want, &[b"AUTH", b"pw"]);
        resp::command(&mut want, &[b"PING", b"0000000000000007"]);
        resp::command(&mut want, &[b"SELECT", b"3"]);
        resp::command(&mut want, &[b"DEL", b"k"]);
        resp::command(&mut want, &[b"RESET"]);
        assert_eq!(p.head, want);
        let p = plan(
            &Request {
                db: Some(2),
                exptime: Some(30),
                ..req(Command::Set)
            },
            5,
        );
        let mut whole = p.head.clone();
        whole.extend_from_slice(b"hello");
        whole.extend_from_slice(&p.tail);
        let mut want = Vec::new();
        resp::command(&mut want, &[b"PING", b"0000000000000007"]);
        resp::command(&mut want, &[b"SELECT", b"2"]);
        resp::command(&mut want, &[b"SET", b"k", b"hello", b"EX", b"30"]);
        resp::command(&mut want, &[b"SELECT", b"0"]);
        assert_eq!(whole, want);
    }

    /// The reader of a planned request (PING included), for GET.
    fn planned(auth: bool, db: Option<u32>) -> Exchange {
        plan(
            &Request {
                auth: auth.then_some(&b"pw"[..]),
                db,
                ..req(Command::Get)
            },
            0,
        )
        .exchange
    }

    #[test]
    fn replies_start_after_the_echo_of_ping() {
        for (auth, db, input) in [
            (false, None, [ECHO, b"$2\r\nok\r\n"].concat()),
            (false, Some(3), [ECHO, b"+OK\r\n$2\r\nok\r\n+OK\r\n"].concat()),
            // An authenticated GET ends with its value (no RESET after it:
            // its connection closes instead of being kept).
            (true, None, [&b"+OK\r\n"[..], ECHO, b"$2\r\nok\r\n"].concat()),
            (true, Some(3), [&b"+OK\r\n"[..], ECHO, b"+OK\r\n$2\r\nok\r\n"].concat()),
        ] {
            let input = &input[..];
            for piece in 1..input.len() + 1 {
                let mut ex = planned(auth, db);
                let (events, rest) = run(&mut ex, input, piece);
                assert_eq!(events, ["answer 200 Some(2)", "done", "value ok"], "{input:?} {piece}");
                assert!(rest.is_empty() && ex.is_done());
                assert_eq!(ex.keeps(), !auth, "an authenticated GET's connection is not kept");
            }
        }
    }

    #[test]
    fn publish_sends_the_body_and_counts_its_receivers() {
        let p = plan(
            &Request {
                auth: Some(&b"pw"[..]),
                key: b"news",
                ..req(Command::Publish)
            },
            3,
        );
        let mut whole = p.head.clone();
        whole.extend_from_slice(b"a\nb");
        whole.extend_from_slice(&p.tail);
        let mut want = Vec::new();
        resp::command(&mut want, &[b"AUTH", b"pw"]);
        resp::command(&mut want, &[b"PING", b"0000000000000007"]);
        resp::command(&mut want, &[b"PUBLISH", b"news", b"a\nb"]);
        resp::command(&mut want, &[b"RESET"]);
        assert_eq!(whole, want);
        let input = [&b"+OK\r\n"[..], ECHO, b":2\r\n+RESET\r\n"].concat();
        for piece in 1..input.len() + 1 {
            let mut ex = p.exchange.clone();
            let (events, rest) = run(&mut ex, &input, piece);
            assert_eq!(events, ["answer 200 None", "done"], "{piece}");
            assert!(rest.is_empty() && ex.keeps());
            assert_eq!(ex.count(), Some(2));
            ex.restart();
            assert_eq!(ex.count(), None);
        }
        // Anything but an integer is no answer to PUBLISH.
        let mut ex = plan(&req(Command::Publish), 0).exchange;
        let (events, _) = run(&mut ex, &[ECHO, b"+OK\r\n"].concat(), 64);
        assert_eq!(events, ["failed redis sent an invalid reply to PUBLISH"]);
    }

    #[test]
    fn stream_add_sends_the_body_and_answers_its_id() {
        let p = plan(
            &Request {
                key: b"s",
                maxlen: 5,
                event: Some(&b"e"[..]),
                ..req(Command::StreamAdd)
            },
            1,
        );
        let mut whole = p.head.clone();
        whole.push(b'x');
        whole.extend_from_slice(&p.tail);
        let mut want = Vec::new();
        resp::command(&mut want, &[b"PING", b"0000000000000007"]);
        resp::command(
            &mut want,
            &[
                b"XADD", b"s", b"MAXLEN", b"~", b"5", b"*", b"data", b"x", b"event", b"e",
            ],
        );
        assert_eq!(whole, want);
        let input = [ECHO, b"$15\r\n1700000000000-0\r\n"].concat();
        for piece in 1..input.len() + 1 {
            let mut ex = p.exchange.clone();
            let (events, rest) = run(&mut ex, &input, piece);
            assert_eq!(events, ["answer 201 None", "done"], "{piece}");
            assert!(rest.is_empty());
            assert_eq!(ex.answer_body().unwrap(), b"{\"id\":\"1700000000000-0\"}");
            ex.restart();
            assert_eq!(ex.answer_body(), None);
        }
        let mut ex = plan(&req(Command::StreamAdd), 0).exchange;
        let (events, _) = run(&mut ex, &[ECHO, b":1\r\n"].concat(), 64);
        assert_eq!(events, ["failed redis sent an invalid reply to XADD"]);
    }

    #[test]
    fn reset_follows_authenticated_stores_and_deletes_not_gets() {
        for (command, reset) in [(Command::Get, false), (Command::Set, true), (Command::Del, true)] {
            let p = plan(
                &Request {
                    auth: Some(&b"pw"[..]),
                    ..req(command)
                },
                0,
            );
            let bytes = [p.head, p.tail].concat();
            let has = bytes.windows(5).any(|w| w == b"RESET");
            assert_eq!(has, reset, "{command:?}");
            assert_eq!(p.exchange.keeps(), reset, "{command:?}");
        }
    }

    #[test]
    fn anything_before_the_echo_of_ping_is_stale() {
        let stale = |line: &str| {
            format!("failed redis sent \"{line}\" where the echo of PING was due: bytes that are not this request's replies (left on a kept connection, or sent unasked)")
        };
        let cases: [(bool, &[u8], String); 12] = [
            (
                false,
                b"$4\r\nevil\r\n$16\r\n0000000000000007\r\n$2\r\nok\r\n",
                stale("$4"),
            ),
            (false, b"+OK\r\n$16\r\n0000000000000007\r\n", stale("+OK")),
            (false, b":1\r\n$16\r\n0000000000000007\r\n", stale(":1")),
            (false, b"$-1\r\n$16\r\n0000000000000007\r\n", stale("$-1")),
            // A reply to a PING without a token, or another request's echo.
            (
                false,
                b"+PONG\r\n$6\r\nSTALE!\r\n$16\r\n0000000000000007\r\n",
                stale("+PONG"),
            ),
            (false, b"$16\r\n0000000000000006\r\n", stale("$16")),
            (false, b"$16\r\n0000000000000007XX", stale("$16")),
            (false, b"$17\r\n0000000000000007x\r\n", stale("$17")),
            // One reply too many in front of AUTH's shifts +OK to where the echo is due.
            (true, b"+OK\r\n+OK\r\n$16\r\n0000000000000007\r\n", stale("+OK")),
            (
                false,
                b"-NOAUTH Authentication required.\r\n",
                "failed PING was refused: NOAUTH Authentication required.".into(),
            ),
            (
                false,
                b"hello there\r\n",
                "failed redis sent an invalid reply to PING".into(),
            ),
            (
                false,
                b"$9999999999\r\n",
                "failed redis sent a value length of 9999999999 bytes, more than 536870912 allowed".into(),
            ),
        ];
        for (auth, input, want) in cases {
            for piece in [1, input.len()] {
                let mut ex = planned(auth, None);
                let (events, _) = run(&mut ex, input, piece);
                assert_eq!(events, [want.clone()], "{input:?} {piece}");
            }
        }
        // What is shown of a long stale line is bounded, and escaped.
        let mut ex = planned(false, None);
        let mut long = b"+\x01".to_vec();
        long.extend_from_slice(&[b'x'; 100]);
        long.extend_from_slice(b"\r\n");
        let (events, _) = run(&mut ex, &long, long.len());
        assert_eq!(events, [stale(&format!("+\\x01{}", "x".repeat(STALE_SHOWN - 2)))]);
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_db(b"0"), Ok(None));
        assert_eq!(parse_db(b"15"), Ok(Some(15)));
        assert_eq!(parse_db(b"2147483647"), Ok(Some(2147483647)));
        assert_eq!(parse_db(b"2147483648"), Err(BadNumber));
        assert_eq!(parse_db(b"4294967295"), Err(BadNumber));
        assert_eq!(parse_db(b"4294967296"), Err(BadNumber));
        assert_eq!(parse_db(b"-1"), Err(BadNumber));
        assert_eq!(parse_db(b"-2147483648"), Err(BadNumber));
        assert_eq!(parse_db(b""), Err(BadNumber));
        assert_eq!(parse_db(b"1 "), Err(BadNumber));
        assert_eq!(parse_exptime(b"0"), Ok(None));
        assert_eq!(parse_exptime(b"300"), Ok(Some(300)));
        assert_eq!(parse_exptime(b"9223372036854775"), Ok(Some(9223372036854775)));
        assert_eq!(parse_exptime(b"9223372036854776"), Err(BadNumber));
        assert_eq!(parse_exptime(b"99999999999999999999999"), Err(BadNumber));
    }

    #[test]
    fn a_value_in_any_pieces() {
        let input = b"+OK\r\n$12\r\nhello\r\nworld\r\n+OK\r\n";
        for piece in 1..input.len() + 1 {
            let mut ex = Exchange::new(&[Setup::Select], Command::Get, &[Setup::SelectZero]);
            let (events, rest) = run(&mut ex, input, piece);
            assert_eq!(
                events,
                ["answer 200 Some(12)", "done", "value hello\r\nworld"],
                "piece {piece}"
            );
            assert!(rest.is_empty());
            assert!(ex.is_done());
        }
    }

    #[test]
    fn answers_without_values() {
        for (command, input, status) in [
            (Command::Get, &b"$-1\r\n"[..], 404),
            (Command::Set, b"+OK\r\n", 201),
            (Command::Del, b":1\r\n", 204),
            (Command::Del, b":0\r\n", 404),
        ] {
            let mut ex = Exchange::new(&[], command, &[]);
            let (events, _) = run(&mut ex, input, 1);
            assert_eq!(events, [format!("answer {status} None"), "done".into()]);
        }
    }

    #[test]
    fn errors_and_garbage_fail() {
        let cases: [(&[u8], &str); 8] = [
            (b"-ERR wrong\r\n", "failed redis answered GET with an error: ERR wrong"),
            (b"+OK\r\n", "failed redis sent an invalid reply to GET"),
            (b"hello\r\n", "failed redis sent an invalid reply to GET"),
            (b"*1\r\n$1\r\na\r\n", "failed redis sent an invalid reply to GET"),
            (
                b"$9223372036854775807\r\na",
                "failed redis sent a value length of 9223372036854775807 bytes, more than 536870912 allowed",
            ),
            (b"$1\r\naXY", "failed redis sent an invalid end of value"),
            (
                b"$1\r\na\r\n+OK\r\n",
                "failed redis sent bytes that no command asked for",
            ),
            (b"$-1\r\n:1\r\n", "failed redis sent bytes that no command asked for"),
        ];
        for (input, want) in cases {
            let mut ex = Exchange::new(&[], Command::Get, &[]);
            let (events, _) = run(&mut ex, input, input.len());
            assert_eq!(
                events.iter().find(|e| e.starts_with("failed")).unwrap(),
                want,
                "{input:?}"
            );
            assert!(!ex.is_done());
        }
    }

    #[test]
    fn a_bad_value_end_is_seen_ahead() {
        let answer = |input: &[u8]| {
            let mut ex = Exchange::new(&[], Command::Get, &[]);
            let (ev, used) = ex.step(input);
            assert!(matches!(ev, Event::Answer { status: 200, .. }), "{ev:?}");
            (ex, used)
        };
        for bad in [
            &b"$3\r\nabcXY"[..],
            b"$3\r\nabcXYZ\r\n",
            b"$3\r\nabc\rX",
            b"$3\r\nabcX",
            b"$0\r\n\n",
        ] {
            let (ex, used) = answer(bad);
            assert_eq!(
                ex.check_value_end(&bad[used..]),
                Err(ReplyError::BadValueEnd),
                "{bad:?}"
            );
        }
        for fine in [
            &b"$3\r\nabc\r\n"[..],
            b"$3\r\nabc\r",
            b"$3\r\nabc",
            b"$3\r\nab",
            b"$3\r\n",
            b"$3\r\nabc\r\n+anything",
            b"$0\r\n\r\n",
        ] {
            let (ex, used) = answer(fine);
            assert_eq!(ex.check_value_end(&fine[used..]), Ok(()), "{fine:?}");
        }
        // Part of the value read already, part of the CRLF too.
        let (mut ex, used) = answer(b"$3\r\nab");
        assert_eq!(used, 4);
        assert_eq!(ex.step(b"ab"), (Event::Value(b"ab"), 2));
        assert_eq!(ex.check_value_end(b"c\rX"), Err(ReplyError::BadValueEnd));
        assert_eq!(ex.check_value_end(b"c\r\n"), Ok(()));
        assert_eq!(ex.step(b"c\r"), (Event::Value(b"c"), 1));
        assert_eq!(ex.step(b"\r"), (Event::More, 1));
        assert_eq!(ex.check_value_end(b"X"), Err(ReplyError::BadValueEnd));
        assert_eq!(ex.check_value_end(b"\n"), Ok(()));
        // Outside a value there is nothing to look at.
        let ex = Exchange::new(&[], Command::Get, &[]);
        assert_eq!(ex.check_value_end(b"garbage"), Ok(()));
    }

    #[test]
    fn refused_setup_and_restore() {
        let mut ex = Exchange::new(&[Setup::Auth], Command::Get, &[Setup::Reset]);
        let (events, _) = run(&mut ex, b"-WRONGPASS invalid password\r\n", 3);
        assert_eq!(events, ["failed AUTH was refused: WRONGPASS invalid password"]);
        let mut ex = Exchange::new(&[Setup::Auth], Command::Get, &[Setup::Reset]);
        let (events, _) = run(&mut ex, b"+OK\r\n$-1\r\n-ERR unknown command 'RESET'\r\n", 4);
        assert_eq!(
            events,
            [
                "answer 404 None",
                "failed RESET was refused: ERR unknown command 'RESET'"
            ]
        );
    }

    #[test]
    fn a_value_longer_than_usize_pieces_is_counted_exactly() {
        let mut ex = Exchange::new(&[], Command::Get, &[]);
        let (ev, used) = ex.step(b"$5\r\nab");
        assert_eq!(
            (ev, used),
            (
                Event::Answer {
                    status: 200,
                    value: Some(5)
                },
                4
            )
        );
        assert_eq!(ex.step(b"ab"), (Event::Value(b"ab"), 2));
        assert_eq!(ex.step(b""), (Event::More, 0));
        assert_eq!(ex.step(b"cde\r"), (Event::Value(b"cde"), 3));
        assert_eq!(ex.step(b"\r"), (Event::More, 1));
        assert_eq!(ex.step(b"\n"), (Event::Done, 1));
        assert_eq!(ex.step(b""), (Event::Done, 0));
        assert!(matches!(ex.step(b"x").0, Event::Failed(ReplyError::Unsolicited)));
    }

    #[test]
    fn cluster_steps_in_one_round_trip() {
        let p = plan(
            &Request {
                cluster: Some(ClusterSteps {
                    slots: true,
                    asking: true,
                }),
                ..req(Command::Get)
            },
            0,
        );
        let mut want = Vec::new();
        resp::command(&mut want, &[b"PING", b"0000000000000007"]);
        resp::command(&mut want, &[b"CLUSTER", b"SLOTS"]);
        resp::command(&mut want, &[b"ASKING"]);
        resp::command(&mut want, &[b"GET", b"k"]);
        assert_eq!(p.head, want);
        let slots = b"*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n";
        let input = [ECHO, &slots[..], b"+OK\r\n$2\r\nok\r\n"].concat();
        for piece in 1..input.len() + 1 {
            let mut ex = p.exchange.clone();
            let mut pending: Vec<u8> = Vec::new();
            let mut seen = Vec::new();
            for chunk in input.chunks(piece) {
                pending.extend_from_slice(chunk);
                loop {
                    let (ev, used) = ex.step(&pending);
                    let stop = matches!(ev, Event::More | Event::Done | Event::Failed(_));
                    match ev {
                        Event::Slots(v) => {
                            seen.push(format!("slots {}", crate::cluster::parse_slots(&v).unwrap().len()))
                        }
                        Event::Answer { status, .. } => seen.push(format!("answer {status}")),
                        Event::Done => seen.push("done".into()),
                        Event::Failed(e) => seen.push(format!("failed {e}")),
                        _ => {}
                    }
                    pending.drain(..used);
                    if stop {
                        break;
                    }
                }
            }
            assert_eq!(seen, ["slots 1", "answer 200", "done"], "piece {piece}");
        }
    }

    #[test]
    fn redirects_only_from_cluster_nodes() {
        let cluster = Request {
            cluster: Some(ClusterSteps::default()),
            ..req(Command::Get)
        };
        let mut ex = plan(&cluster, 0).exchange;
        let input = [ECHO, b"-MOVED 3999 127.0.0.1:7002\r\n"].concat();
        let (ev, _) = ex.step(&input);
        assert_eq!(
            ev,
            Event::Redirect(Redirect {
                kind: cluster::RedirectKind::Moved,
                slot: 3999,
                host: "127.0.0.1".into(),
                port: 7002
            })
        );
        assert!(ex.is_done());
        let mut ex = plan(&req(Command::Get), 0).exchange;
        assert!(matches!(ex.step(&input).0, Event::Failed(ReplyError::Failed { .. })));
        // A refused CLUSTER SLOTS (a node without cluster support).
        let mut ex = plan(
            &Request {
                cluster: Some(ClusterSteps {
                    slots: true,
                    asking: false,
                }),
                ..req(Command::Get)
            },
            0,
        )
        .exchange;
        let input = [ECHO, b"-ERR This instance has cluster support disabled\r\n"].concat();
        let (ev, _) = ex.step(&input);
        assert_eq!(
            ev.clone(),
            Event::Failed(ReplyError::Refused {
                setup: Setup::Slots,
                message: b"ERR This instance has cluster support disabled".to_vec()
            })
        );
        if let Event::Failed(e) = ev {
            assert_eq!(
                e.to_string(),
                "CLUSTER SLOTS was refused: ERR This instance has cluster support disabled"
            );
        }
    }

    #[test]
    fn pipelined_requests_carry_no_auth_and_nothing_after() {
        let p = plan_pipelined(
            &Request {
                db: Some(3),
                auth: Some(b"pw"),
                ..req(Command::Get)
            },
            0,
        );
        let text = String::from_utf8(p.head.clone()).unwrap();
        assert!(!text.contains("AUTH"), "{text}");
        assert!(text.starts_with("*2\r\n$4\r\nPING\r\n"), "{text}");
        assert!(
            text.ends_with("*2\r\n$6\r\nSELECT\r\n$1\r\n3\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"),
            "{text}"
        );
        assert!(p.tail.is_empty());
        let mut ex = p.exchange;
        let input = [ECHO, b"+OK\r\n$2\r\nhi\r\n"].concat();
        let (ev, used) = ex.step(&input);
        assert_eq!(
            ev,
            Event::Answer {
                status: 200,
                value: Some(2)
            }
        );
        let (ev, n) = ex.step(&input[used..]);
        assert_eq!(ev, Event::Value(b"hi"));
        let (ev, m) = ex.step(&input[used + n..]);
        assert_eq!(ev, Event::Done);
        assert_eq!(used + n + m, input.len());
        // Without a database: PING and the command only.
        let p = plan_pipelined(&req(Command::Del), 0);
        assert!(!String::from_utf8(p.head).unwrap().contains("SELECT"));
    }

    #[test]
    fn setup_exchanges_end_after_their_last_reply() {
        let (out, mut ex) = plan_setup(Some(b"pw"), Some(9), 7);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("*2\r\n$4\r\nAUTH\r\n$2\r\npw\r\n"), "{text}");
        assert!(text.ends_with("$6\r\nSELECT\r\n$1\r\n9\r\n"), "{text}");
        let input = [b"+OK\r\n", ECHO, b"+OK\r\n"].concat();
        assert_eq!(ex.step(&input), (Event::Done, input.len()));
        // A refused SELECT: nothing ran in the wrong database (no command
        // was sent), and the refusal is the last reply.
        let (_, mut ex) = plan_setup(None, Some(99), 7);
        let input = [ECHO, b"-ERR DB index is out of range\r\n"].concat();
        let (ev, used) = ex.step(&input);
        assert_eq!(
            ev,
            Event::Failed(ReplyError::Refused {
                setup: Setup::Select,
                message: b"ERR DB index is out of range".to_vec()
            })
        );
        assert_eq!(used, ECHO.len());
        // A stale reply where the echo is due.
        let (_, mut ex) = plan_setup(None, None, 7);
        assert!(matches!(ex.step(b"+OK\r\n").0, Event::Failed(ReplyError::Stale(_))));
    }
}
