//! `sql::has_several_statements` and `sql::quote_literal`.
//!
//! What must hold:
//! - on any bytes, `has_several_statements` does not panic, is false without
//!   a ';', and does not change when whitespace or a final ';' is appended;
//! - on SQL generated here from the input, statement by statement, out of
//!   the tokens of PostgreSQL's lexer (identifiers, all kinds of quotes,
//!   dollar quotes, comments, numbers, operators, empty statements) with ';'
//!   sprinkled inside quotes and comments, it answers exactly "two statements
//!   or more", as PostgreSQL (standard_conforming_strings on) counts them;
//! - `quote_literal` refuses exactly the values with a NUL; otherwise its
//!   literal starts with `'` (and then holds no backslash, so it reads the
//!   same whatever standard_conforming_strings says) or `E'` (exactly when
//!   the value has a backslash), reads back to the value with the unquoter
//!   below, and stays one statement inside a query.

use crate::source::Source;
use gateway_core::sql::{has_several_statements as several, quote_literal};

pub fn sql_statements(data: &[u8]) {
    raw(data);
    literal(data);
    if let Some((&mode, rest)) = data.split_first() {
        if mode & 1 == 1 {
            generated(&mut Source::new(rest));
        }
    }
}

fn raw(sql: &[u8]) {
    let answer = several(sql);
    if !sql.contains(&b';') {
        assert!(!answer, "several statements without a ';'");
    }
    for tail in [&b" \n\t"[..], b";", b"; \r\n"] {
        let longer = [sql, tail].concat();
        assert_eq!(
            several(&longer),
            answer,
            "appending {tail:?} changed the answer for {:?}",
            String::from_utf8_lossy(sql)
        );
    }
}

/// Reads one SQL string literal that must make up all of `q`: `'...'`
/// with `''` for a quote, or `E'...'` where `\\` and `\'` are escapes too.
fn unquote(q: &[u8]) -> Option<Vec<u8>> {
    let (escapes, body) = match q {
        [b'E', b'\'', body @ ..] => (true, body),
        [b'\'', body @ ..] => (false, body),
        _ => return None,
    };
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        let c = *body.get(i)?;
        if c == b'\'' {
            if body.get(i + 1) == Some(&b'\'') {
                out.push(b'\'');
                i += 2;
                continue;
            }
            return (i + 1 == body.len()).then_some(out);
        }
        if escapes && c == b'\\' {
            match *body.get(i + 1)? {
                e @ (b'\\' | b'\'') => out.push(e),
                _ => return None, // the quoter writes no other escape
            }
            i += 2;
            continue;
        }
        out.push(c);
        i += 1;
    }
}

fn literal(value: &[u8]) {
    let Some(q) = quote_literal(value) else {
        assert!(value.contains(&0), "quote_literal refused a value without NUL");
        return;
    };
    assert!(!value.contains(&0), "quote_literal took a value with a NUL");
    assert!(!q.contains(&0));
    if value.contains(&b'\\') {
        assert!(q.starts_with(b"E'"), "a backslash outside an E'' literal");
    } else {
        assert!(q.starts_with(b"'") && !q.contains(&b'\\'));
    }
    assert_eq!(unquote(&q).as_deref(), Some(value), "{:?}", String::from_utf8_lossy(&q));
    let mut query = [&b"select "[..], &q, b" as v"].concat();
    assert!(!several(&query), "{:?}", String::from_utf8_lossy(&query));
    query.extend_from_slice(b"; select 2");
    assert!(several(&query), "{:?}", String::from_utf8_lossy(&query));
}

const WHITESPACE: &[u8] = b" \t\n\r\x0c";
const KEYWORDS: &[&str] = &[
    "select", "insert", "update", "with", "values", "begin", "commit", "SET", "é",
];
const OPERATORS: &[&str] = &[
    "+", "-", "*", "/", "=", "<>", "<=", "!=", "(", ")", ",", "::", ".", "[", "]", "%", "^", "|", "@", "#",
];
const NUMBERS: &[&str] = &["0", "42", "1.5", "1e5", ".5", "2E-3", "$1", "$12"];
/// Letters and pieces of identifiers and dollar-quote tags: '$' may follow
/// the first letter of an identifier, never of a tag; bytes over 0x7f are
/// letters to PostgreSQL.
const IDENT_START: &[&str] = &["a", "E", "e", "x", "_", "Q", "é"];
const IDENT_CONT: &[&str] = &["a", "E", "e", "_", "0", "9", "$", "é", "$$"];
const TAG_CONT: &[&str] = &["a", "E", "_", "0", "9", "é"];

fn identifier(src: &mut Source, out: &mut Vec<u8>) {
    out.extend_from_slice(src.pick(IDENT_START).as_bytes());
    for _ in 0..src.below(5) {
        out.extend_from_slice(src.pick(IDENT_CONT).as_bytes());
    }
}

/// Bytes for inside quotes and comments: no NUL, and the bytes that matter
/// to the scanner are frequent.
fn content(src: &mut Source) -> Vec<u8> {
    const LIKELY: &[u8] = b";;;''\"\\$$-/*\n\rEe ";
    let n = src.below(12);
    (0..n)
        .map(|_| {
            let b = src.byte();
            if b & 0x80 != 0 {
                LIKELY[b as usize % LIKELY.len()]
            } else if b == 0 {
                b'0'
            } else {
                b
            }
        })
        .collect()
}

/// `'...'` with quotes doubled; backslashes are plain characters.
fn standard_string(src: &mut Source, out: &mut Vec<u8>) {
    out.push(b'\'');
    for b in content(src) {
        if b == b'\'' {
            out.push(b'\'');
        }
        out.push(b);
    }
    out.push(b'\'');
}

/// One token of a statement; the caller separates tokens.
fn token(src: &mut Source, out: &mut Vec<u8>) {
    match src.below(11) {
        0 | 1 => identifier(src, out),
        2 => {
            // An identifier of two letters or more glued to a string: the
            // string is a standard one, whatever letter ends the identifier.
            identifier(src, out);
            out.extend_from_slice(src.pick(IDENT_CONT).as_bytes());
            standard_string(src, out);
        }
        3 => standard_string(src, out),
        4 => {
            // Bit, hex and national strings: the rules of a standard string.
            out.push(src.pick(b"bBxXnN"));
            standard_string(src, out);
        }
        5 => {
            out.push(src.pick(b"Ee"));
            out.push(b'\'');
            for b in content(src) {
                match b {
                    b'\'' => out.extend_from_slice(src.pick(&[&b"''"[..], b"\\'"])),
                    b'\\' => out.extend_from_slice(b"\\\\"),
                    b';' if src.bool() => out.extend_from_slice(b"\\;"),
                    b => out.push(b),
                }
            }
            out.push(b'\'');
        }
        6 => {
            out.push(b'"');
            out.push(b'q');
            for b in content(src) {
                if b == b'"' {
                    out.push(b'"');
                }
                out.push(b);
            }
            out.push(b'"');
        }
        7 => {
            let mut tag = b"$".to_vec();
            if src.bool() {
                tag.extend_from_slice(src.pick(&["a", "t", "_", "é", "Ab"]).as_bytes());
                for _ in 0..src.below(3) {
                    tag.extend_from_slice(src.pick(TAG_CONT).as_bytes());
                }
            }
            tag.push(b'$');
            let mut body = content(src);
            let mut whole = [&body[..], &tag].concat();
            if whole.windows(tag.len()).position(|w| w == tag) != Some(body.len()) {
                body.iter_mut().filter(|b| **b == b'$').for_each(|b| *b = b'#');
                whole = [&body[..], &tag].concat();
            }
            out.extend_from_slice(&tag);
            out.extend_from_slice(&whole);
        }
        8 => out.extend_from_slice(src.pick(NUMBERS).as_bytes()),
        _ => out.extend_from_slice(src.pick(OPERATORS).as_bytes()),
    }
}

/// Whitespace and comments; `last` when nothing follows, so a line comment
/// may end with the input.
fn gap(src: &mut Source, out: &mut Vec<u8>, needed: bool, last: bool) {
    let n = src.below(3) + needed as usize;
    for i in 0..n {
        match src.below(6) {
            0 => {
                // "--" up to a line end, which is LF or CR to PostgreSQL.
                out.extend_from_slice(b"--");
                out.extend(content(src).into_iter().filter(|b| !matches!(b, b'\n' | b'\r')));
                if !(last && i + 1 == n && src.bool()) {
                    out.push(src.pick(b"\n\r"));
                }
            }
            1 => block_comment(src, out, 2),
            _ => {
                for _ in 0..=src.below(2) {
                    out.push(src.pick(WHITESPACE));
                }
            }
        }
    }
}

/// `/* ... */`, nested up to `depth`; a space after the opening and before
/// the closing keeps the content from forming either.
fn block_comment(src: &mut Source, out: &mut Vec<u8>, depth: u32) {
    out.extend_from_slice(b"/* ");
    out.extend(content(src).into_iter().map(|b| if b == b'*' { b'+' } else { b }));
    if depth > 0 && src.below(4) == 0 {
        out.push(b' ');
        block_comment(src, out, depth - 1);
        out.push(b' ');
        out.extend(content(src).into_iter().map(|b| if b == b'*' { b'+' } else { b }));
    }
    out.extend_from_slice(b" */");
}

/// Empty statements: ';' with gaps.
fn empties(src: &mut Source, out: &mut Vec<u8>) {
    for _ in 0..src.below(3) {
        out.push(b';');
        gap(src, out, false, false);
    }
}

fn generated(src: &mut Source) {
    let statements = 1 + src.below(3);
    let mut sql = Vec::new();
    gap(src, &mut sql, false, false);
    if src.below(4) == 0 {
        empties(src, &mut sql);
    }
    for s in 0..statements {
        if s > 0 {
            gap(src, &mut sql, false, false);
            sql.push(b';');
            gap(src, &mut sql, false, false);
            empties(src, &mut sql);
        }
        sql.extend_from_slice(src.pick(KEYWORDS).as_bytes());
        for _ in 0..src.below(6) {
            gap(src, &mut sql, true, false);
            token(src, &mut sql);
        }
    }
    if src.bool() {
        gap(src, &mut sql, false, false);
        sql.push(b';');
        empties(src, &mut sql);
    }
    gap(src, &mut sql, false, true);
    assert_eq!(
        several(&sql),
        statements > 1,
        "{statements} statement(s): {:?}",
        String::from_utf8_lossy(&sql)
    );
    raw(&sql);
}
