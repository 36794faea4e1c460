//! `template::split` on arbitrary template text.
//!
//! What must hold: the pieces, written back the way they were found
//! (`$var::type` or `${var}::type`), give the input again; parameters are
//! well formed and the type is taken whole (nothing of a type name or a
//! `[]` is left behind in the text); no text piece is empty or next to
//! another; a text piece holds no parameter that was missed; and the SQL
//! the module sends (each parameter as `$N::type`) splits into the same
//! pieces with N for the names.

use gateway_core::template::{split, Piece};

fn is_var_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn is_type_char(b: u8) -> bool {
    is_var_char(b) || b == b'.'
}

/// A type as written: `[A-Za-z_][A-Za-z0-9_.]*` then any number of `[]`.
fn well_formed_type(ty: &str) -> bool {
    let b = ty.as_bytes();
    let base = b.len() - b.iter().rev().take_while(|&&c| c == b'[' || c == b']').count();
    let (name, arrays) = b.split_at(base);
    matches!(name.first(), Some(c) if c.is_ascii_alphabetic() || *c == b'_')
        && name.iter().all(|&c| is_type_char(c))
        && arrays.len() % 2 == 0
        && arrays.chunks(2).all(|p| p == b"[]")
}

pub fn template_split(data: &[u8]) {
    let pieces = split(data);
    let mut at = 0;
    let mut sql = Vec::new();
    let mut params = 0;
    for (i, piece) in pieces.iter().enumerate() {
        match piece {
            Piece::Text(t) => {
                assert!(!t.is_empty(), "empty text piece");
                if i > 0 {
                    assert!(!matches!(pieces[i - 1], Piece::Text(_)), "two text pieces side by side");
                }
                assert!(data[at..].starts_with(t), "text piece {i} is not the input");
                at += t.len();
                assert_eq!(split(t), vec![piece.clone()], "a parameter inside a text piece");
                sql.extend_from_slice(t);
            }
            Piece::Param { var, ty } => {
                assert!(!var.is_empty() && var.bytes().all(is_var_char), "variable {var:?}");
                assert!(well_formed_type(ty), "type {ty:?}");
                let plain = format!("${var}::{ty}");
                let braced = format!("${{{var}}}::{ty}");
                let rest = &data[at..];
                let written = if rest.starts_with(plain.as_bytes()) {
                    plain.len()
                } else if rest.starts_with(braced.as_bytes()) {
                    braced.len()
                } else {
                    panic!("parameter {i} ({var}, {ty}) is not the input");
                };
                at += written;
                // The type is taken whole: its name (unless `[]` ended it), then every `[]`.
                let next = &data[at..];
                let name_goes_on = !ty.ends_with(']') && next.first().is_some_and(|&c| is_type_char(c));
                assert!(!name_goes_on && !next.starts_with(b"[]"), "type {ty:?} cut short");
                params += 1;
                sql.extend_from_slice(format!("${params}::{ty}").as_bytes());
            }
        }
    }
    assert_eq!(at, data.len(), "the pieces leave input out");

    // The SQL as the module builds it.
    let again = split(&sql);
    assert_eq!(again.len(), pieces.len(), "{:?}", String::from_utf8_lossy(&sql));
    let mut n = 0;
    for (a, b) in pieces.iter().zip(&again) {
        match (a, b) {
            (Piece::Text(x), Piece::Text(y)) => assert_eq!(x, y),
            (Piece::Param { ty: t1, .. }, Piece::Param { var, ty: t2 }) => {
                n += 1;
                assert_eq!(*var, n.to_string());
                assert_eq!(t1, t2);
            }
            _ => panic!("the SQL splits differently: {:?}", String::from_utf8_lossy(&sql)),
        }
    }
}
