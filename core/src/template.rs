//! Query templates with typed parameters.
//!
//! In a `sqldb_query` template, an nginx variable followed by a type cast,
//! `$arg_id::int` or `${arg_id}::int`, is a bound parameter: the SQL text
//! gets `$1::int` and the variable's value travels separately, so it can
//! never change the statement. A variable without a cast is substituted
//! into the text as it is.

/// A piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// SQL text, possibly with untyped nginx variables.
    Text(Vec<u8>),
    /// A typed variable: its nginx variable name and the SQL type as written.
    Param { var: String, ty: String },
}

fn is_var_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Splits a template into text and typed parameters.
pub fn split(template: &[u8]) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let mut text = Vec::new();
    let mut i = 0;
    let n = template.len();
    while i < n {
        if template[i] == b'$' {
            if let Some((var, ty, end)) = typed_at(template, i) {
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                pieces.push(Piece::Param { var, ty });
                i = end;
                continue;
            }
        }
        text.push(template[i]);
        i += 1;
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    pieces
}

/// `$name::type` or `${name}::type` at `at`: (name, type, end).
fn typed_at(s: &[u8], at: usize) -> Option<(String, String, usize)> {
    let mut i = at + 1;
    let name;
    if s.get(i) == Some(&b'{') {
        let close = s[i..].iter().position(|&b| b == b'}')? + i;
        name = &s[i + 1..close];
        i = close + 1;
    } else {
        let start = i;
        while i < s.len() && is_var_char(s[i]) {
            i += 1;
        }
        name = &s[start..i];
    }
    if name.is_empty() || !name.iter().all(|&b| is_var_char(b)) {
        return None;
    }
    if !s[i..].starts_with(b"::") {
        return None;
    }
    i += 2;
    let ty_start = i;
    if !s.get(i).is_some_and(|b| b.is_ascii_alphabetic() || *b == b'_') {
        return None;
    }
    while i < s.len() && (is_var_char(s[i]) || s[i] == b'.') {
        i += 1;
    }
    while s[i..].starts_with(b"[]") {
        i += 2;
    }
    let ty = &s[ty_start..i];
    Some((
        String::from_utf8_lossy(name).into_owned(),
        String::from_utf8_lossy(ty).into_owned(),
        i,
    ))
}

/// The first typed parameter written inside a string literal, a quoted
/// name or a comment (where it cannot be a parameter: PostgreSQL would see
/// `$1` as text there, and the query would not match its values), with
/// what it is inside.
pub fn misplaced_param(template: &[u8]) -> Option<(String, crate::sql::Region)> {
    let regions = crate::sql::regions(template);
    let mut i = 0;
    while i < template.len() {
        if template[i] == b'$' {
            if let Some((_, _, end)) = typed_at(template, i) {
                if let Some((_, region)) = regions.iter().find(|(r, _)| r.contains(&i)) {
                    return Some((String::from_utf8_lossy(&template[i..end]).into_owned(), *region));
                }
                i = end;
                continue;
            }
        }
        i += 1;
    }
    None
}

/// The first variable written with a cast but no type (`$arg_id::` and
/// then no type name), outside literals, quoted names and comments: a
/// typed parameter whose type was left out, which would reach the server
/// as broken SQL.
pub fn cast_without_type(template: &[u8]) -> Option<String> {
    let regions = crate::sql::regions(template);
    let mut i = 0;
    while i < template.len() {
        if template[i] == b'$' && !regions.iter().any(|(r, _)| r.contains(&i)) {
            if let Some((_, _, end)) = typed_at(template, i) {
                i = end;
                continue;
            }
            let mut j = i + 1;
            if template.get(j) == Some(&b'{') {
                match template[j..].iter().position(|&b| b == b'}') {
                    Some(close) => j += close + 1,
                    None => {
                        i += 1;
                        continue;
                    }
                }
            } else {
                while j < template.len() && is_var_char(template[j]) {
                    j += 1;
                }
            }
            // (A quoted type name, `$x::"My Type"`, is a cast of the text.)
            if j > i + 1 && template[j..].starts_with(b"::") && template.get(j + 2) != Some(&b'"') {
                return Some(String::from_utf8_lossy(&template[i..j + 2]).into_owned());
            }
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cast_without_a_type_is_found() {
        assert_eq!(cast_without_type(b"select $arg_x::int, ${y}::text[]"), None);
        assert_eq!(cast_without_type(b"select $arg_x::"), Some("$arg_x::".into()));
        assert_eq!(cast_without_type(b"select ${arg_x}:: + 1"), Some("${arg_x}::".into()));
        assert_eq!(cast_without_type(b"select $a:: int"), Some("$a::".into()));
        assert_eq!(cast_without_type(b"select '$a::' || $1::int"), None);
        assert_eq!(cast_without_type(b"select $$ $a:: $$"), None);
        assert_eq!(cast_without_type(b"select $a::\"My Type\""), None);
    }

    #[test]
    fn parameters_inside_quotes_or_comments_are_found() {
        use crate::sql::Region;
        assert_eq!(misplaced_param(b"select $a::int, '$a' || $b::text"), None);
        assert_eq!(
            misplaced_param(b"select '$a::int'"),
            Some(("$a::int".into(), Region::Literal))
        );
        assert_eq!(
            misplaced_param(b"select E'x\\'$b::int'"),
            Some(("$b::int".into(), Region::Literal))
        );
        assert_eq!(
            misplaced_param(b"select $q$ $c::text $q$"),
            Some(("$c::text".into(), Region::Literal))
        );
        assert_eq!(
            misplaced_param(b"select 1 as \"${d}::int\""),
            Some(("${d}::int".into(), Region::Identifier))
        );
        assert_eq!(
            misplaced_param(b"select 1 -- $e::int\n, $f::int"),
            Some(("$e::int".into(), Region::Comment))
        );
        assert_eq!(
            misplaced_param(b"select /* $g::int */ 1"),
            Some(("$g::int".into(), Region::Comment))
        );
        assert_eq!(misplaced_param(b"select 'it''s', $h::int"), None);
    }

    fn text(s: &str) -> Piece {
        Piece::Text(s.as_bytes().to_vec())
    }
    fn param(v: &str, t: &str) -> Piece {
        Piece::Param {
            var: v.into(),
            ty: t.into(),
        }
    }

    #[test]
    fn typed_variables_become_parameters() {
        assert_eq!(
            split(b"select * from t where id = $arg_id::int and name = ${arg_n}::text"),
            vec![
                text("select * from t where id = "),
                param("arg_id", "int"),
                text(" and name = "),
                param("arg_n", "text")
            ]
        );
        assert_eq!(split(b"$1::bigint"), vec![param("1", "bigint")]);
        assert_eq!(
            split(b"select $request_body::jsonb, $arg_a::pg_catalog.int4[]"),
            vec![
                text("select "),
                param("request_body", "jsonb"),
                text(", "),
                param("arg_a", "pg_catalog.int4[]")
            ]
        );
    }

    #[test]
    fn untyped_variables_and_casts_stay_text() {
        for t in [
            "select '$arg_x' as x",
            "select $arg_x",
            "select 1::int",
            "select '$arg_x'::int",
            "select $$a$$",
            "select $arg_x:: int",
            "select $arg_x::1bad",
            "select ${}::int",
            "select ${arg::int",
        ] {
            assert_eq!(split(t.as_bytes()), vec![text(t)], "{t}");
        }
        assert!(split(b"").is_empty());
    }
}
