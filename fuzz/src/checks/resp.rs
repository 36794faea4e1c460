//! `resp::reply_header` on arbitrary bytes.
//!
//! What must hold: the answer agrees with a model of RESP2 reply headers
//! written here (a header line ends at its first CR or LF, which must be
//! a CRLF); `used` never passes the buffer and is the length of the
//! header line with its CRLF; and an answer other than `Incomplete` is
//! final: the module acts on it at once, so more bytes arriving behind it
//! must not change it (the same stream cut differently by the network
//! gives the same reply).

use gateway_core::resp::{reply_header, Reply, MAX_BULK, MAX_LINE};

pub fn resp_reply(data: &[u8]) {
    // libFuzzer's inputs are a few KiB, MAX_LINE is 64 KiB: an input that
    // starts with '#' stands for a line near that limit (its type byte, a
    // filler, then the rest of the input).
    if let [b'#', kind, pad, rest @ ..] = data {
        let mut buf = vec![*kind];
        buf.resize(MAX_LINE - 8 + (*pad as usize % 16), b'x');
        buf.extend_from_slice(rest);
        check_stream(&buf);
    } else {
        check_stream(data);
    }
}

/// Checks the whole buffer and prefixes of it.
fn check_stream(buf: &[u8]) {
    let crlf = find_crlf(buf);
    let full = check_one(buf, crlf);
    let cuts: Vec<usize> = if buf.len() <= 64 {
        (0..buf.len()).collect()
    } else {
        // Around the first CRLF, around MAX_LINE, and a few others.
        let mut c = vec![1, buf.len() / 2, buf.len() - 1];
        if let Some(end) = crlf {
            c.extend([end, end + 1, end + 2]);
        }
        c.extend(MAX_LINE - 2..MAX_LINE + 2);
        c.retain(|&k| k < buf.len());
        c
    };
    for k in cuts {
        let part = check_one(&buf[..k], crlf.filter(|&e| e + 2 <= k));
        if part.0 != Reply::Incomplete {
            assert_eq!(part, full, "the answer for {k} bytes changed when more arrived");
        }
    }
}

fn find_crlf(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

/// `-?[0-9]{1,19}` as i64 (what Redis sends; no '+', no padding beyond
/// an i64's digits).
fn decimal(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s {
        [b'-', d @ ..] => (true, d),
        d => (false, d),
    };
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut v: i128 = 0;
    for &d in digits {
        v = v * 10 + (d - b'0') as i128;
        if v > i64::MAX as i128 + 1 {
            return None;
        }
    }
    i64::try_from(if neg { -v } else { v }).ok()
}

/// The model: what the header at the start of `buf` is, `crlf` being
/// where its first CRLF is.
fn model(buf: &[u8], crlf: Option<usize>) -> (Reply<'_>, usize) {
    // No header holds a CR or LF: a line's first one of them must be its CRLF.
    if let Some(i) = buf.iter().position(|&b| b == b'\r' || b == b'\n') {
        let bare_cr = buf[i] == b'\r' && i + 1 < buf.len() && crlf != Some(i);
        if buf[i] == b'\n' || bare_cr {
            return (Reply::Invalid, 0);
        }
    }
    let Some(end) = crlf else {
        // A line must end (CRLF included) within MAX_LINE bytes.
        let r = if buf.len() >= MAX_LINE {
            Reply::Invalid
        } else {
            Reply::Incomplete
        };
        return (r, 0);
    };
    if end == 0 || end + 2 > MAX_LINE {
        return (Reply::Invalid, 0);
    }
    let line = &buf[1..end];
    let r = match (buf[0], decimal(line)) {
        (b'+', _) => Reply::Status(line),
        (b'-', _) => Reply::Error(line),
        (b':', Some(n)) => Reply::Integer(n),
        (b'$' | b'*', Some(-1)) if line == b"-1" => Reply::Nil,
        // A length over Redis's own limit is not to be trusted.
        (b'$', Some(n)) if n as u64 > MAX_BULK && n >= 0 => Reply::TooLong(n as u64),
        (b'$', Some(n)) if n >= 0 => Reply::Bulk(n as u64),
        _ => Reply::Invalid,
    };
    let used = if matches!(r, Reply::Invalid | Reply::TooLong(_)) {
        0
    } else {
        end + 2
    };
    (r, used)
}

fn check_one(buf: &[u8], crlf: Option<usize>) -> (Reply<'_>, usize) {
    let got = reply_header(buf);
    let (reply, used) = &got;
    assert!(*used <= buf.len());
    match reply {
        Reply::Incomplete | Reply::Invalid | Reply::TooLong(_) => assert_eq!(*used, 0),
        _ => {
            assert!(*used >= 3 && &buf[used - 2..*used] == b"\r\n");
            assert!(*used <= MAX_LINE, "a header line of {used} bytes was accepted");
        }
    }
    if *reply == Reply::Incomplete {
        assert!(crlf.is_none(), "Incomplete with a CRLF in the buffer");
    }
    assert_eq!(
        got,
        model(buf, crlf),
        "{:?}",
        String::from_utf8_lossy(&buf[..buf.len().min(80)])
    );
    got
}
