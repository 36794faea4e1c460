//! `rds::decode` on arbitrary bytes, and `rds::encode` then `decode` on
//! result sets built from the input.
//!
//! What must hold:
//! - decoding arbitrary bytes does not panic; a stream it accepts, encoded
//!   again from what was decoded, gives the same bytes (but the two fields
//!   the encoder computes: result type 0 and the std type of each column's
//!   OID); every shorter prefix of it is `Truncated`, a byte more is
//!   `TrailingBytes(1)`, a first byte other than 0 is `BadEndian`;
//! - encoding a result set writes exactly `encoded_len` bytes after what
//!   `out` held, and decodes back to the same header, columns (std type of
//!   the OID, OID as u16) and cells; a statement without rows has no row
//!   list; a length over a limit is the error for it, with nothing written.

use super::table::{cell_bytes, table, Table};
use crate::source::Source;
use gateway_core::rds::{
    decode, encode, encoded_len, std_type, Body, DecodeError, Decoded, Header, RdsError, ResultSet,
};

pub fn rds_decode(data: &[u8]) {
    raw(data);
    if let Some((&mode, rest)) = data.split_first() {
        if mode & 1 == 1 {
            structured(&mut Source::new(rest));
        }
    }
}

/// A decoded stream seen as a result set, to encode it again.
struct Again<'a>(&'a Decoded);

impl ResultSet for Again<'_> {
    fn columns(&self) -> usize {
        self.0.columns.len()
    }
    fn rows(&self) -> usize {
        self.0.rows.len()
    }
    fn column_name(&self, col: usize) -> &[u8] {
        &self.0.columns[col].2
    }
    fn column_type(&self, col: usize) -> u32 {
        self.0.columns[col].1 as u32
    }
    fn value(&self, row: usize, col: usize) -> Option<&[u8]> {
        self.0.rows[row][col].as_deref()
    }
}

const HEADER_FIXED: usize = 30;

fn raw(data: &[u8]) {
    let decoded = decode(data);
    match (&decoded, data.first()) {
        (_, None) => assert_eq!(decoded, Err(DecodeError::Truncated)),
        (_, Some(&e)) if e != 0 => assert_eq!(decoded, Err(DecodeError::BadEndian(e))),
        _ => {}
    }
    let Ok(d) = decoded else { return };

    let header = Header {
        std_errcode: d.std_errcode,
        driver_errcode: d.driver_errcode,
        errstr: &d.errstr,
        affected_rows: d.affected_rows,
        insert_id: d.insert_id,
    };
    let mut out = Vec::new();
    let n = encode(&header, &Body::Rows(&Again(&d)), &mut out).expect("a decoded stream encodes");
    assert_eq!(n, out.len());
    let mut want = data.to_vec();
    want[5] = 0;
    let mut at = HEADER_FIXED + d.errstr.len();
    for (_, oid, name) in &d.columns {
        want[at..at + 2].copy_from_slice(&std_type(*oid as u32).to_le_bytes());
        at += 6 + name.len();
    }
    assert_eq!(out, want, "encoding the decoded stream again differs");
    if d.columns.is_empty() {
        let mut none = Vec::new();
        encode::<Again>(&header, &Body::NoRows, &mut none).unwrap();
        assert_eq!(none, want);
    }

    let cuts: Vec<usize> = if data.len() <= 64 {
        (0..data.len()).collect()
    } else {
        (0..8).map(|i| i * data.len() / 8).chain([data.len() - 1]).collect()
    };
    for k in cuts {
        assert_eq!(decode(&data[..k]), Err(DecodeError::Truncated), "prefix of {k} bytes");
    }
    assert_eq!(decode(&[data, &[0]].concat()), Err(DecodeError::TrailingBytes(1)));
}

/// As many columns as asked, all named `c` and empty, for the column limit.
struct Wide(usize);

impl ResultSet for Wide {
    fn columns(&self) -> usize {
        self.0
    }
    fn rows(&self) -> usize {
        0
    }
    fn column_name(&self, _: usize) -> &[u8] {
        b"c"
    }
    fn column_type(&self, _: usize) -> u32 {
        25
    }
    fn value(&self, _: usize, _: usize) -> Option<&[u8]> {
        None
    }
}

fn structured(src: &mut Source) {
    let mut t = table(src);
    // Now and then a name or an error text at the u16 limit or past it.
    if !t.columns.is_empty() && src.below(64) == 0 {
        let c = src.below(t.columns.len());
        t.columns[c].0 = vec![b'n'; 65535 + src.below(2)];
    }
    let errstr = if src.below(64) == 0 {
        vec![b'e'; 65535 + src.below(2)]
    } else {
        cell_bytes(src, 8)
    };
    let header = Header {
        std_errcode: src.u16(),
        driver_errcode: src.u16(),
        errstr: &errstr,
        affected_rows: src.u64(),
        insert_id: src.u64(),
    };
    let before = src.bytes(4).to_vec();
    match src.below(8) {
        0 => one(&header, &Body::<Table>::NoRows, &Table::default(), &before),
        1 if src.below(32) == 0 => {
            let wide = Wide(65535 + src.below(2));
            let mut out = before.clone();
            match encode(&header, &Body::Rows(&wide), &mut out) {
                Ok(n) => {
                    let d = decode(&out[before.len()..]).unwrap();
                    assert_eq!((n, d.columns.len()), (out.len() - before.len(), wide.0));
                }
                Err(e) => {
                    assert!(
                        e == RdsError::TooManyColumns(65536) || matches!(e, RdsError::ErrstrTooLong(_)),
                        "{e:?}"
                    );
                    assert_eq!(out, before);
                }
            }
        }
        _ => one(&header, &Body::Rows(&t), &t, &before),
    }
}

/// Encodes `body` after `before` and checks it against `t`.
fn one(header: &Header, body: &Body<Table>, t: &Table, before: &[u8]) {
    let len = encoded_len(header, body);
    let mut out = before.to_vec();
    let got = encode(header, body, &mut out);
    // The limits, in the order the encoder checks them.
    let limit = if header.errstr.len() > 65535 {
        Some(RdsError::ErrstrTooLong(header.errstr.len()))
    } else if matches!(body, Body::Rows(_)) {
        t.columns
            .iter()
            .position(|(name, _)| name.len() > 65535)
            .map(RdsError::ColumnNameTooLong)
    } else {
        None
    };
    if let Some(e) = limit {
        assert_eq!(len, Err(e.clone()));
        assert_eq!(got, Err(e));
        assert_eq!(out, before, "bytes written before an error");
        return;
    }
    let n = got.expect("encodes");
    assert_eq!(Ok(n), len);
    assert_eq!(out.len(), before.len() + n);
    assert_eq!(&out[..before.len()], before);
    let d = decode(&out[before.len()..]).expect("decodes");
    assert_eq!(
        (
            d.std_errcode,
            d.driver_errcode,
            &d.errstr[..],
            d.affected_rows,
            d.insert_id
        ),
        (
            header.std_errcode,
            header.driver_errcode,
            header.errstr,
            header.affected_rows,
            header.insert_id
        )
    );
    let rows_body = matches!(body, Body::Rows(_));
    let columns: Vec<(u16, u16, Vec<u8>)> = if rows_body {
        t.columns
            .iter()
            .map(|(name, oid)| (std_type(*oid), *oid as u16, name.clone()))
            .collect()
    } else {
        Vec::new()
    };
    assert_eq!(d.columns, columns);
    let rows = if rows_body && !t.columns.is_empty() {
        t.rows.clone()
    } else {
        Vec::new()
    };
    assert_eq!(d.rows, rows);
    raw(&out[before.len()..]);
}
