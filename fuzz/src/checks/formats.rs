//! The text, JSON and CSV encoders and the row-by-row `Stream`, on result
//! sets built from the input.
//!
//! What must hold:
//! - JSON output is valid JSON (serde_json reads it) and is the array of
//!   objects docs/sqldb.md describes: each row an object keyed by column name,
//!   NULL `null`, bool `true`/`false`, a number column's value a number
//!   when it is a JSON number and a string otherwise (NaN, Infinity),
//!   json/jsonb embedded, anything else the string (bytes that are not
//!   UTF-8 as U+FFFD); `{"affected":N}` reads back to N;
//! - CSV output, read back with the csv crate, gives a header record of the
//!   column names and one record per row of the cells (NULL empty);
//! - text output is every cell row by row, each on a line ended by `\n`
//!   (the last one too), NULL `(null)`;
//! - `Stream`, fed the rows in results of any sizes (empty ones included),
//!   gives the bytes of the whole-result encoders, RDS included, and counts
//!   the rows.

use super::table::{table, Slice, Table};
use crate::source::Source;
use gateway_core::formats::{csv, json, json_affected, text, Stream, StreamFormat};
use gateway_core::rds::{self, Body, Header};
use serde_json::{Map, Value};
use std::cell::RefCell;
use std::io::Cursor;

pub fn formats(data: &[u8]) {
    let mut src = Source::new(data);
    let t = table(&mut src);
    check_json(&t);
    check_csv(&t);
    check_text(&t);
    let cuts: Vec<usize> = (0..8).map(|_| src.below(4)).collect();
    for format in [
        StreamFormat::Rds,
        StreamFormat::Json,
        StreamFormat::Csv,
        StreamFormat::Text,
    ] {
        check_stream(&t, format, &cuts);
    }
    let n = src.u64();
    let mut out = Vec::new();
    json_affected(n, &mut out);
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v, serde_json::json!({ "affected": n }));
}

/// A number as JSON writes it: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
fn json_number(v: &[u8]) -> bool {
    fn digits(v: &[u8], i: &mut usize) -> usize {
        let start = *i;
        while *i < v.len() && v[*i].is_ascii_digit() {
            *i += 1;
        }
        *i - start
    }
    let mut i = 0;
    if v.first() == Some(&b'-') {
        i += 1;
    }
    match v.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => {
            digits(v, &mut i);
        }
        _ => return false,
    }
    if v.get(i) == Some(&b'.') {
        i += 1;
        if digits(v, &mut i) == 0 {
            return false;
        }
    }
    if matches!(v.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(v.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if digits(v, &mut i) == 0 {
            return false;
        }
    }
    i == v.len()
}

fn lossy(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}

fn expected_cell(oid: u32, v: Option<&[u8]>) -> Value {
    let Some(v) = v else { return Value::Null };
    match oid {
        16 => Value::Bool(v == b"t"),
        20 | 21 | 23 | 26 | 700 | 701 | 1700 if json_number(v) => serde_json::from_slice(v).unwrap(),
        114 | 3802 => serde_json::from_slice(v).unwrap(),
        _ => Value::String(lossy(v)),
    }
}

fn check_json(t: &Table) {
    let mut out = Vec::new();
    json(t, &mut out);
    let got: Value = serde_json::from_slice(&out)
        .unwrap_or_else(|e| panic!("invalid JSON ({e}): {:?}", String::from_utf8_lossy(&out)));
    let want = Value::Array(
        t.rows
            .iter()
            .map(|row| {
                let mut obj = Map::new();
                for ((name, oid), v) in t.columns.iter().zip(row) {
                    obj.insert(lossy(name), expected_cell(*oid, v.as_deref()));
                }
                Value::Object(obj)
            })
            .collect(),
    );
    assert_eq!(got, want, "{:?}", String::from_utf8_lossy(&out));
}

thread_local! {
    /// One reader, reset for each input: building one costs more than the
    /// whole check. Flexible, as a reset keeps the first record's length;
    /// the records are compared whole below.
    static CSV_READER: RefCell<::csv::Reader<Cursor<Vec<u8>>>> =
        RefCell::new(::csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(Cursor::new(Vec::new())));
}

fn check_csv(t: &Table) {
    let mut out = Vec::new();
    csv(t, &mut out);
    if t.columns.is_empty() {
        // No fields at all: an empty line per row.
        assert_eq!(out, b"\r\n".repeat(t.rows.len() + 1));
        return;
    }
    assert!(out.ends_with(b"\r\n"));
    let got: Vec<Vec<Vec<u8>>> = CSV_READER.with(|reader| {
        let mut reader = reader.borrow_mut();
        *reader.get_mut() = Cursor::new(out.clone());
        reader.seek(::csv::Position::new()).unwrap();
        reader
            .byte_records()
            .map(|r| {
                let r = r.unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&out)));
                r.iter().map(<[u8]>::to_vec).collect()
            })
            .collect()
    });
    let mut want = vec![t.columns.iter().map(|c| c.0.clone()).collect::<Vec<_>>()];
    for row in &t.rows {
        want.push(row.iter().map(|v| v.clone().unwrap_or_default()).collect());
    }
    assert_eq!(got, want, "{:?}", String::from_utf8_lossy(&out));
}

fn check_text(t: &Table) {
    let mut out = Vec::new();
    text(t, &mut out);
    let mut want = Vec::new();
    for v in t.rows.iter().flatten() {
        want.extend_from_slice(v.as_deref().unwrap_or(b"(null)"));
        want.push(b'\n');
    }
    assert_eq!(out, want);
}

fn check_stream(t: &Table, format: StreamFormat, cuts: &[usize]) {
    // The results as they arrive: rows in groups of the sizes in `cuts`
    // (then one by one), ending with an empty one.
    let mut results = Vec::new();
    let mut at = 0;
    let mut sizes = cuts.iter().copied().chain(std::iter::repeat(1));
    while at < t.rows.len() {
        let n = sizes.next().unwrap().min(t.rows.len() - at);
        results.push(at..at + n);
        at += n;
    }
    results.push(at..at);

    let mut stream = Stream::new(format);
    let mut out = Vec::new();
    stream
        .begin(
            &Slice {
                table: t,
                rows: results[0].clone(),
            },
            &mut out,
        )
        .unwrap();
    for r in &results {
        stream
            .rows_of(
                &Slice {
                    table: t,
                    rows: r.clone(),
                },
                &mut out,
            )
            .unwrap();
    }
    stream.end(&mut out);
    assert_eq!(stream.rows(), t.rows.len() as u64);

    let mut whole = Vec::new();
    match format {
        StreamFormat::Rds => {
            let header = Header {
                driver_errcode: 2,
                ..Header::default()
            };
            rds::encode(&header, &Body::Rows(t), &mut whole).unwrap();
        }
        StreamFormat::Json => json(t, &mut whole),
        StreamFormat::Csv => csv(t, &mut whole),
        StreamFormat::Text => text(t, &mut whole),
    }
    assert_eq!(
        out,
        whole,
        "{format:?} streamed differs from whole, {} columns, {} rows",
        t.columns.len(),
        t.rows.len()
    );
}
