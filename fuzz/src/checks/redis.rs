//! `redis::Exchange`, the reader of a cache request's replies, on arbitrary
//! bytes in arbitrary pieces.
//!
//! What must hold: the events do not depend on how the bytes are cut; a
//! value's bytes are exactly the bytes of the bulk, and never more than its
//! length; `Done` only when the last reply ended exactly (bytes after it are
//! `Unsolicited`); an answer comes once, and its status matches the
//! command's reply; a bulk length over MAX_BULK never yields value bytes.
//! And for well-formed replies built here, the outcome is the expected one.

use crate::source::Source;
use gateway_core::redis::{Command, Event, Exchange, ReplyError, Setup};
use gateway_core::resp::MAX_BULK;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    answer: Option<(u16, Option<u64>)>,
    value: Vec<u8>,
    end: Option<Result<(), ReplyError>>,
}

/// Feeds `input` in pieces cut at `cuts`, keeping unconsumed bytes (a
/// partial line) as the module does.
fn feed(mut ex: Exchange, input: &[u8], cuts: &[usize]) -> Outcome {
    let mut out = Outcome {
        answer: None,
        value: Vec::new(),
        end: None,
    };
    let mut pending: Vec<u8> = Vec::new();
    let mut from = 0;
    let ends = cuts.iter().copied().chain([input.len()]);
    for to in ends {
        let to = to.clamp(from, input.len());
        pending.extend_from_slice(&input[from..to]);
        from = to;
        loop {
            let (ev, used) = ex.step(&pending);
            assert!(used <= pending.len());
            let stop = match ev {
                Event::More => true,
                Event::Answer { status, value } => {
                    assert!(out.answer.is_none(), "two answers");
                    assert!(value.is_none_or(|n| n <= MAX_BULK));
                    out.answer = Some((status, value));
                    false
                }
                Event::Value(v) => {
                    assert!(!v.is_empty(), "an empty value piece");
                    assert!(used == v.len());
                    out.value.extend_from_slice(v);
                    let (_, len) = out.answer.expect("value bytes before the answer");
                    assert!(out.value.len() as u64 <= len.expect("a value was announced"));
                    false
                }
                Event::Done => {
                    if used == pending.len() {
                        out.end.get_or_insert(Ok(()));
                        true
                    } else {
                        false
                    }
                }
                Event::Failed(e) => {
                    out.end = Some(Err(e));
                    return out;
                }
                Event::Slots(_) | Event::Redirect(_) => panic!("a cluster event outside a cluster"),
            };
            pending.drain(..used);
            if stop {
                break;
            }
        }
    }
    out
}

struct Shape {
    before: Vec<Setup>,
    command: Command,
    after: Vec<Setup>,
}

impl Shape {
    fn new(src: &mut Source) -> Shape {
        // As the module plans it (AUTH, PING, SELECT), and in other orders.
        let before = if src.bool() {
            let mut b = Vec::new();
            if src.bool() {
                b.push(Setup::Auth);
            }
            b.push(Setup::Ping);
            if src.bool() {
                b.push(Setup::Select);
            }
            b
        } else {
            (0..src.below(3))
                .map(|_| src.pick(&[Setup::Auth, Setup::Ping, Setup::Select]))
                .collect()
        };
        Shape {
            before,
            command: src.pick(&[
                Command::Get,
                Command::Set,
                Command::Del,
                Command::Publish,
                Command::StreamAdd,
            ]),
            after: (0..src.below(2))
                .map(|_| src.pick(&[Setup::Reset, Setup::SelectZero]))
                .collect(),
        }
    }

    fn exchange(&self) -> Exchange {
        Exchange::new(&self.before, self.command, &self.after)
    }
}

pub fn redis_exchange(data: &[u8]) {
    let mut src = Source::new(data);
    let shape = Shape::new(&mut src);
    let ex = shape.exchange();
    let well_formed = src.bool();
    let mut cuts: Vec<usize> = (0..src.below(6)).map(|_| src.below(64)).collect();
    cuts.sort_unstable();
    let (input, want) = if well_formed {
        let (i, w) = replies(&mut src, &shape);
        (i, Some(w))
    } else {
        (src.rest().to_vec(), None)
    };
    let whole = feed(ex.clone(), &input, &[]);
    let pieces = feed(ex.clone(), &input, &cuts);
    let bytes: Vec<usize> = (1..input.len()).collect();
    let dripped = feed(ex, &input, &bytes);
    assert_eq!(whole, pieces, "the cuts changed the outcome");
    assert_eq!(whole, dripped, "one byte at a time changed the outcome");
    if let Some(want) = want {
        assert_eq!(whole, want);
    }
}

/// Well-formed replies for the exchange, and what reading them gives.
fn replies(src: &mut Source, shape: &Shape) -> (Vec<u8>, Outcome) {
    let mut out = Vec::new();
    for s in &shape.before {
        if *s == Setup::Ping {
            // The echo of the token (Exchange::new's, for number 0).
            out.extend_from_slice(b"$16\r\n");
            out.extend_from_slice(&gateway_core::redis::ping_token(0));
            out.extend_from_slice(b"\r\n");
        } else {
            out.extend_from_slice(b"+OK\r\n");
        }
    }
    let value: Vec<u8> = src.bytes(40).to_vec();
    let (answer, val) = match shape.command {
        Command::Get if src.bool() => {
            out.extend_from_slice(format!("${}\r\n", value.len()).as_bytes());
            out.extend_from_slice(&value);
            out.extend_from_slice(b"\r\n");
            ((200, Some(value.len() as u64)), value)
        }
        Command::Get => {
            out.extend_from_slice(b"$-1\r\n");
            ((404, None), Vec::new())
        }
        Command::Set => {
            out.extend_from_slice(b"+OK\r\n");
            ((201, None), Vec::new())
        }
        Command::Publish => {
            let n = src.below(3);
            out.extend_from_slice(format!(":{n}\r\n").as_bytes());
            ((200, None), Vec::new())
        }
        Command::Del => {
            let n = src.below(3);
            out.extend_from_slice(format!(":{n}\r\n").as_bytes());
            ((if n > 0 { 204 } else { 404 }, None), Vec::new())
        }
        Command::StreamAdd => {
            // The entry's ID, a bulk string (read whole, not passed on).
            let id = format!("{}-{}", src.below(1_000_000), src.below(10));
            out.extend_from_slice(format!("${}\r\n{id}\r\n", id.len()).as_bytes());
            ((201, None), Vec::new())
        }
    };
    for _ in &shape.after {
        out.extend_from_slice(b"+OK\r\n");
    }
    let extra = src.bool();
    if extra {
        out.extend_from_slice(b"+X\r\n");
    }
    let end = if extra { Err(ReplyError::Unsolicited) } else { Ok(()) };
    (
        out,
        Outcome {
            answer: Some(answer),
            value: val,
            end: Some(end),
        },
    )
}
