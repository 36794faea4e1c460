//! A small SQL scanner: does a query hold more than one statement? Such a
//! query must go through the simple protocol; a single statement may be
//! prepared. Quotes, dollar quotes and comments are skipped, so a ';' inside
//! them does not count.

/// True when a statement follows a ';' (not inside quotes or comments) that
/// ends another one. Empty statements (a leading ';', ";;") do not count:
/// PostgreSQL drops them.
pub fn has_several_statements(sql: &[u8]) -> bool {
    // A statement has begun; a ';' has ended one.
    let mut begun = false;
    let mut ended = false;
    let mut several = false;
    scan(sql, |token, _| match token {
        Token::Semicolon => ended |= begun,
        Token::Comment | Token::Space => {}
        _ => {
            several |= ended;
            begun = true;
        }
    });
    several
}

/// Statements whose effect outlives their sync point on the session: a
/// transaction left open, a setting, a COPY, a cursor, a lock, a prepared
/// statement of its own. A request that runs one must have the connection
/// to itself: a query pipelined behind it would run inside its transaction
/// or under its settings.
const SESSION_KEYWORDS: &[&str] = &[
    "begin",
    "start",
    "commit",
    "end",
    "rollback",
    "abort",
    "savepoint",
    "release",
    "set",
    "reset",
    "discard",
    "deallocate",
    "prepare",
    "execute",
    "listen",
    "unlisten",
    "lock",
    "copy",
    "declare",
    "fetch",
    "move",
    "close",
    "do",
    "call",
];

/// Functions that change the session from inside any statement.
const SESSION_FUNCTIONS: &[&str] = &[
    "set_config",
    "pg_advisory_lock",
    "pg_advisory_lock_shared",
    "dblink_connect",
];

/// True when the SQL may change its session beyond its own sync point
/// (see SESSION_KEYWORDS): a statement that starts with one of those
/// keywords, or a call of one of SESSION_FUNCTIONS anywhere.
pub fn changes_session(sql: &[u8]) -> bool {
    let mut first = true;
    let mut found = false;
    scan(sql, |token, range| match token {
        Token::Semicolon => first = true,
        Token::Comment | Token::Space => {}
        Token::Word => {
            let word = String::from_utf8_lossy(&sql[range]).to_ascii_lowercase();
            if (first && SESSION_KEYWORDS.contains(&word.as_str())) || SESSION_FUNCTIONS.contains(&word.as_str()) {
                found = true;
            }
            first = false;
        }
        _ => first = false,
    });
    found
}

/// True when one of `words` (lower case) is a word of the SQL, outside
/// literals, quoted names and comments, in any letter case.
pub fn has_word(sql: &[u8], words: &[&str]) -> bool {
    let mut found = false;
    scan(sql, |token, range| {
        if token == Token::Word
            && words
                .iter()
                .any(|w| sql[range.clone()].eq_ignore_ascii_case(w.as_bytes()))
        {
            found = true;
        }
    });
    found
}

/// Where a piece of SQL is not plain code: the text inside it is data
/// (a string), a name, or nothing at all (a comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Region {
    /// '...', E'...' or $tag$...$tag$.
    Literal,
    /// "...".
    Identifier,
    /// -- ... or /* ... */.
    Comment,
}

/// The byte ranges of literals, quoted names and comments, in order.
pub fn regions(sql: &[u8]) -> Vec<(std::ops::Range<usize>, Region)> {
    let mut out = Vec::new();
    scan(sql, |token, range| {
        let region = match token {
            Token::Literal => Region::Literal,
            Token::Identifier => Region::Identifier,
            Token::Comment => Region::Comment,
            _ => return,
        };
        out.push((range, region));
    });
    out
}

/// What the scanner met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    Literal,
    Identifier,
    Comment,
    /// A name or keyword (E'...' is a Literal).
    Word,
    Semicolon,
    Space,
    /// Any other byte.
    Other,
}

/// PostgreSQL's lexer, as far as quoting goes: calls `on` for each token
/// with its byte range.
fn scan(sql: &[u8], mut on: impl FnMut(Token, std::ops::Range<usize>)) {
    let mut i = 0;
    let n = sql.len();
    while i < n {
        let start = i;
        let b = sql[i];
        let token = match b {
            b'\'' => {
                i = skip_quoted(sql, i, false);
                Token::Literal
            }
            b'"' => {
                i = skip_quoted(sql, i, false);
                Token::Identifier
            }
            b'-' if i + 1 < n && sql[i + 1] == b'-' => {
                // To the end of the line: PostgreSQL's lexer ends it at CR too.
                while i < n && sql[i] != b'\n' && sql[i] != b'\r' {
                    i += 1;
                }
                Token::Comment
            }
            b'/' if i + 1 < n && sql[i + 1] == b'*' => {
                let mut depth = 1;
                i += 2;
                while i < n && depth > 0 {
                    if sql[i] == b'/' && i + 1 < n && sql[i + 1] == b'*' {
                        depth += 1;
                        i += 2;
                    } else if sql[i] == b'*' && i + 1 < n && sql[i + 1] == b'/' {
                        depth -= 1;
                        i += 2;
                    } else {
                        i += 1;
                    }
                }
                Token::Comment
            }
            b'$' if dollar_tag(&sql[i..]).is_some() => {
                let tag_len = dollar_tag(&sql[i..]).unwrap_or(1);
                let tag = &sql[i..i + tag_len];
                i += tag_len;
                while i < n && !sql[i..].starts_with(tag) {
                    i += 1;
                }
                i += tag_len;
                Token::Literal
            }
            b';' => {
                i += 1;
                Token::Semicolon
            }
            c if is_ident_start(c) => {
                // A name or keyword as a whole: '$' inside one is a letter
                // (a$b$ is a name, not the start of a dollar quote).
                i += 1;
                while i < n && (is_ident_start(sql[i]) || sql[i].is_ascii_digit() || sql[i] == b'$') {
                    i += 1;
                }
                // E'...' is one token, an escape string; xE'...' is a name and a string.
                if i - start == 1 && matches!(c, b'E' | b'e') && sql.get(i) == Some(&b'\'') {
                    i = skip_quoted(sql, i, true);
                    Token::Literal
                } else {
                    Token::Word
                }
            }
            c if c.is_ascii_whitespace() => {
                i += 1;
                Token::Space
            }
            _ => {
                i += 1;
                Token::Other
            }
        };
        on(token, start..i.min(n));
    }
}

/// The end of the quoted string or name at `at`: '...' or "..." with the
/// quote doubled inside, and with `escapes` (E'...') backslash escapes too.
fn skip_quoted(sql: &[u8], at: usize, escapes: bool) -> usize {
    let quote = sql[at];
    let mut i = at + 1;
    while i < sql.len() {
        if escapes && sql[i] == b'\\' {
            i += 2;
            continue;
        }
        if sql[i] == quote {
            if sql.get(i + 1) == Some(&quote) {
                i += 2;
                continue;
            }
            break;
        }
        i += 1;
    }
    i + 1
}

/// A letter to PostgreSQL's lexer: ASCII ones, '_' and every byte over 0x7F.
fn is_ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b >= 0x80
}

/// The length of a dollar-quote opening tag (`$$` or `$name$`) at the start.
fn dollar_tag(s: &[u8]) -> Option<usize> {
    let mut j = 1;
    while j < s.len() {
        match s[j] {
            b'$' => return Some(j + 1),
            c if is_ident_start(c) || c.is_ascii_digit() => {
                if j == 1 && c.is_ascii_digit() {
                    return None; // $1 is a parameter, not a tag
                }
                j += 1;
            }
            _ => return None,
        }
    }
    None
}

#[cfg(test)]
mod session_tests {
    use super::changes_session;

    #[test]
    fn statements_that_change_the_session() {
        for sql in [
            "begin",
            "BEGIN; insert into t values (1)",
            "select 1; commit",
            "set search_path to x",
            "select set_config('client_encoding', 'SJIS', false)",
            "select pg_advisory_lock(1)",
            "copy t from stdin",
            "/* c */ Rollback",
            "declare c cursor for select 1",
        ] {
            assert!(changes_session(sql.as_bytes()), "{sql}");
        }
        for sql in [
            "select 1",
            "insert into t (begin, set) values (1, 2)",
            "select 'begin'",
            "select \"set\" from t",
            "update t set x = 1",
            "select 1 -- commit",
            "select offset_begin from t",
        ] {
            assert!(!changes_session(sql.as_bytes()), "{sql}");
        }
    }
}

/// The name of a statement prepared for `sql`: made of the text itself (a
/// 64-bit FNV-1a hash), so that the same name means the same statement on
/// whatever session a pooler lends, from whatever nginx.
pub fn statement_name(sql: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in sql {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("ngx_gateway_{h:016x}")
}

/// A plain ASCII identifier: a letter or `_`, then letters, digits, `_`
/// and `$` (not empty).
pub fn ascii_identifier(s: &[u8]) -> bool {
    match s.split_first() {
        Some((first, rest)) => {
            (first.is_ascii_alphabetic() || *first == b'_')
                && rest
                    .iter()
                    .all(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b'$')
        }
        None => false,
    }
}

/// A name PostgreSQL takes for a custom setting (set_config): plain
/// identifiers joined by dots, at least two, as its check of such names
/// wants.
pub fn valid_setting_name(name: &[u8]) -> bool {
    name.contains(&b'.') && name.split(|c| *c == b'.').all(ascii_identifier)
}

#[cfg(test)]
mod tests {
    use super::has_several_statements as several;
    use super::valid_setting_name;

    #[test]
    fn setting_names_are_what_postgresql_takes() {
        for ok in ["request.tenant", "request.header.x_tenant", "app._x$1", "a.b.c"] {
            assert!(valid_setting_name(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "tenant",
            "request.1x",
            "request..x",
            ".x",
            "x.",
            "request.x-y",
            "request.$x",
            "1a.b",
            "request.x y",
        ] {
            assert!(!valid_setting_name(bad.as_bytes()), "{bad}");
        }
    }

    #[test]
    fn statement_names_come_from_the_text() {
        use super::statement_name as name;
        // FNV-1a of the empty text is its offset basis.
        assert_eq!(name(b""), "ngx_gateway_cbf29ce484222325");
        assert_eq!(name(b"select 1"), name(b"select 1"));
        assert_ne!(name(b"select 1"), name(b"select 2"));
        assert_ne!(name(b"select $1::int"), name(b"select $1::text"));
        // PostgreSQL's names hold 63 bytes.
        assert!(name(b"select 1").len() <= 63);
    }

    #[test]
    fn single_statements() {
        for q in [
            "select 1",
            "select 1;",
            "select 1 ;  \n",
            "select ';' as a",
            "select 'a;b'';c' as a; -- trailing comment",
            "select E'it\\'s; here'",
            "select e'\\\\'; ",
            "select \"a;b\" from t",
            "select $$x; y$$",
            "select $tag$ ; $$ ; $tag$ as body",
            "select $é$ ; $é$ as body",
            "select 1 /* a; /* nested; */ b; */",
            "select $1::int; ",
            "select 1; /* only a comment */",
            "; select 1",
            " ;; select 1;; ;",
            "/* c */ ; -- c\n select 1",
        ] {
            assert!(!several(q.as_bytes()), "{q}");
        }
    }

    #[test]
    fn several_statements() {
        for q in [
            "select 1; select 2",
            "insert into t values (1);delete from t",
            "set x = 1; select $$a$$",
            "select ';'; select 'b'",
            "begin; commit",
            "select 1; 'x'",
            "select 1 -- comment\r; select 2",
            "select 1 as a$b$; select 2",
            "select 1 as a$b$; select 2 as a$b$",
            "; select 1;; select 2",
            "select namE'a\\'; select 2",
            "select 1 as x, E'\\\\' as y; select 2",
        ] {
            assert!(several(q.as_bytes()), "{q}");
        }
    }
}

/// A SQL string literal for `value`: `'...'` with quotes doubled, or
/// `E'...'` with backslashes doubled too when it holds any, which reads the
/// same whatever `standard_conforming_strings` says. `None` for a value
/// PostgreSQL cannot hold in text (a NUL byte).
pub fn quote_literal(value: &[u8]) -> Option<Vec<u8>> {
    if value.contains(&0) {
        return None;
    }
    let backslash = value.contains(&b'\\');
    let mut out = Vec::with_capacity(value.len() + 3);
    if backslash {
        out.push(b'E');
    }
    out.push(b'\'');
    for &b in value {
        if b == b'\'' || (backslash && b == b'\\') {
            out.push(b);
        }
        out.push(b);
    }
    out.push(b'\'');
    Some(out)
}

#[cfg(test)]
mod quote_tests {
    use super::quote_literal;

    #[test]
    fn literals() {
        assert_eq!(quote_literal(b"plain").unwrap(), b"'plain'");
        assert_eq!(quote_literal(b"it's").unwrap(), b"'it''s'");
        assert_eq!(quote_literal(b"a\\' or 1=1 --").unwrap(), b"E'a\\\\'' or 1=1 --'");
        assert_eq!(quote_literal(b"").unwrap(), b"''");
        assert_eq!(quote_literal(b"nul\0"), None);
    }
}

#[cfg(test)]
mod word_tests {
    use super::has_word;

    #[test]
    fn words_outside_quotes_and_comments() {
        let q = b"select id, data from outbox where id > $1::bigint order by id LIMIT 100";
        assert!(has_word(q, &["limit", "fetch"]));
        assert!(has_word(b"select 1 fetch first 5 rows only", &["limit", "fetch"]));
        assert!(!has_word(
            b"select 'limit 5', \"limit\" -- limit\n/* limit */",
            &["limit"]
        ));
        assert!(!has_word(b"select unlimited, limits from t", &["limit"]));
    }
}
