//! Output formats other than RDS, over the same result sets: plain text,
//! JSON and CSV (RFC 4180).

use crate::rds::ResultSet;

/// PostgreSQL type OIDs that JSON shows as they are.
const JSON_NUMBERS: &[u32] = &[20, 21, 23, 26, 700, 701, 1700];
const BOOL: u32 = 16;
const JSON: u32 = 114;
const JSONB: u32 = 3802;

/// Every cell, row by row, one per line, each line ended by `\n` (so an
/// empty last cell is still a line); NULL as `(null)`.
pub fn text<R: ResultSet + ?Sized>(rs: &R, out: &mut Vec<u8>) {
    for r in 0..rs.rows() {
        text_row(rs, r, out);
    }
}

fn text_row<R: ResultSet + ?Sized>(rs: &R, r: usize, out: &mut Vec<u8>) {
    for c in 0..rs.columns() {
        out.extend_from_slice(rs.value(r, c).unwrap_or(b"(null)"));
        out.push(b'\n');
    }
}

/// Appends `s` as a JSON string; bytes that are not UTF-8 become U+FFFD.
pub fn json_string(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    for ch in String::from_utf8_lossy(s).chars() {
        match ch {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            c if (c as u32) < 0x20 || c == '\u{2028}' || c == '\u{2029}' => {
                out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes())
            }
            c => {
                let mut b = [0; 4];
                out.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
            }
        }
    }
    out.push(b'"');
}

/// A numeric text that JSON can carry unquoted: JSON's number grammar,
/// `-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?`. Not NaN nor Infinity,
/// and not what PostgreSQL never sends for a number but would make the
/// output invalid (`01`, `1.`, `+1`).
fn json_number(v: &[u8]) -> bool {
    let digits = |s: &[u8]| s.iter().take_while(|b| b.is_ascii_digit()).count();
    let mut s = v.strip_prefix(b"-").unwrap_or(v);
    let int = digits(s);
    if int == 0 || (int > 1 && s[0] == b'0') {
        return false;
    }
    s = &s[int..];
    if let Some(frac) = s.strip_prefix(b".") {
        let n = digits(frac);
        if n == 0 {
            return false;
        }
        s = &frac[n..];
    }
    if let Some(exp) = s.strip_prefix(b"e").or_else(|| s.strip_prefix(b"E")) {
        let exp = exp.strip_prefix(b"+").or_else(|| exp.strip_prefix(b"-")).unwrap_or(exp);
        let n = digits(exp);
        if n == 0 {
            return false;
        }
        s = &exp[n..];
    }
    s.is_empty()
}

/// An array of objects keyed by column name.
pub fn json<R: ResultSet + ?Sized>(rs: &R, out: &mut Vec<u8>) {
    out.push(b'[');
    for r in 0..rs.rows() {
        if r > 0 {
            out.push(b',');
        }
        json_row(rs, r, out);
    }
    out.push(b']');
}

/// One row as a JSON object.
fn json_row<R: ResultSet + ?Sized>(rs: &R, r: usize, out: &mut Vec<u8>) {
    out.push(b'{');
    for c in 0..rs.columns() {
        if c > 0 {
            out.push(b',');
        }
        json_string(out, rs.column_name(c));
        out.push(b':');
        let ty = rs.column_type(c);
        match rs.value(r, c) {
            None => out.extend_from_slice(b"null"),
            Some(v) if ty == BOOL => out.extend_from_slice(if v == b"t" { b"true" } else { b"false" }),
            Some(v) if JSON_NUMBERS.contains(&ty) && json_number(v) => out.extend_from_slice(v),
            Some(v) if ty == JSON || ty == JSONB => out.extend_from_slice(v),
            Some(v) => json_string(out, v),
        }
    }
    out.push(b'}');
}

/// `{"affected": N}` for a statement without rows.
pub fn json_affected(affected: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(format!("{{\"affected\":{affected}}}").as_bytes());
}

fn csv_field(out: &mut Vec<u8>, v: &[u8]) {
    if v.iter().any(|b| matches!(b, b',' | b'"' | b'\r' | b'\n')) {
        out.push(b'"');
        for &b in v {
            if b == b'"' {
                out.push(b'"');
            }
            out.push(b);
        }
        out.push(b'"');
    } else {
        out.extend_from_slice(v);
    }
}

/// One CSV line; `None` is an empty field. A line whose only field is
/// empty is written `""`: CSV readers skip an empty line, the row would
/// be lost.
fn csv_line<'a>(out: &mut Vec<u8>, fields: impl ExactSizeIterator<Item = Option<&'a [u8]>>) {
    let alone = fields.len() == 1;
    for (c, v) in fields.enumerate() {
        if c > 0 {
            out.push(b',');
        }
        match v {
            Some(v) if !v.is_empty() => csv_field(out, v),
            _ if alone => out.extend_from_slice(b"\"\""),
            _ => {}
        }
    }
    out.extend_from_slice(b"\r\n");
}

fn csv_header<R: ResultSet + ?Sized>(rs: &R, out: &mut Vec<u8>) {
    csv_line(out, (0..rs.columns()).map(|c| Some(rs.column_name(c))));
}

fn csv_row<R: ResultSet + ?Sized>(rs: &R, r: usize, out: &mut Vec<u8>) {
    csv_line(out, (0..rs.columns()).map(|c| rs.value(r, c)));
}

/// A header line of column names, then one line per row; CRLF line ends;
/// NULL is an empty field.
pub fn csv<R: ResultSet + ?Sized>(rs: &R, out: &mut Vec<u8>) {
    csv_header(rs, out);
    for r in 0..rs.rows() {
        csv_row(rs, r, out);
    }
}

/// A number's decimal digits, written on the stack (no String in between:
/// a variable's value is copied into the request's pool).
pub struct Decimal {
    digits: [u8; 20],
    start: usize,
}

impl Decimal {
    pub fn of(mut n: u64) -> Decimal {
        let mut d = Decimal {
            digits: [0; 20],
            start: 20,
        };
        loop {
            d.start -= 1;
            d.digits[d.start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                return d;
            }
        }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.digits[self.start..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_digits() {
        for n in [0u64, 7, 10, 99, 100, 12345, u64::MAX] {
            assert_eq!(Decimal::of(n).bytes(), n.to_string().as_bytes());
        }
    }

    struct T {
        cols: Vec<(&'static str, u32)>,
        rows: Vec<Vec<Option<&'static [u8]>>>,
    }
    impl ResultSet for T {
        fn columns(&self) -> usize {
            self.cols.len()
        }
        fn rows(&self) -> usize {
            self.rows.len()
        }
        fn column_name(&self, c: usize) -> &[u8] {
            self.cols[c].0.as_bytes()
        }
        fn column_type(&self, c: usize) -> u32 {
            self.cols[c].1
        }
        fn value(&self, r: usize, c: usize) -> Option<&[u8]> {
            self.rows[r][c]
        }
    }

    fn sample() -> T {
        T {
            cols: vec![("id", 23), ("name", 25), ("ok", 16), ("doc", 3802), ("n", 1700)],
            rows: vec![
                vec![
                    Some(b"1"),
                    Some(b"a \"quoted\", line\nbreak"),
                    Some(b"t"),
                    Some(b"{\"x\": [1]}"),
                    Some(b"1.50"),
                ],
                vec![Some(b"2"), None, Some(b"f"), None, Some(b"NaN")],
            ],
        }
    }

    #[test]
    fn text_lists_every_cell() {
        let mut out = Vec::new();
        text(&sample(), &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "1\na \"quoted\", line\nbreak\nt\n{\"x\": [1]}\n1.50\n2\n(null)\nf\n(null)\nNaN\n"
        );
    }

    /// An empty last cell is still a line of its own.
    #[test]
    fn text_ends_every_line() {
        let mut out = Vec::new();
        let rows = T {
            cols: vec![("a", 25), ("b", 25)],
            rows: vec![vec![Some(b"x"), Some(b"")]],
        };
        text(&rows, &mut out);
        assert_eq!(out, b"x\n\n");
    }

    #[test]
    fn json_types() {
        let mut out = Vec::new();
        json(&sample(), &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"[{"id":1,"name":"a \"quoted\", line\nbreak","ok":true,"doc":{"x": [1]},"n":1.50},{"id":2,"name":null,"ok":false,"doc":null,"n":"NaN"}]"#
        );
        let mut empty = Vec::new();
        json(
            &T {
                cols: vec![("a", 23)],
                rows: vec![],
            },
            &mut empty,
        );
        assert_eq!(empty, b"[]");
        let mut aff = Vec::new();
        json_affected(3, &mut aff);
        assert_eq!(aff, br#"{"affected":3}"#);
    }

    #[test]
    fn json_numbers_follow_the_json_grammar() {
        for n in [
            "0",
            "-0",
            "7",
            "-42",
            "1.50",
            "0.001",
            "1e+100",
            "1.5e-07",
            "-1E5",
            "123456789012345678901234567890",
        ] {
            assert!(json_number(n.as_bytes()), "{n}");
        }
        for n in [
            "",
            "-",
            "01",
            "-01",
            "00",
            "1.",
            ".5",
            "+1",
            "1e",
            "1e+",
            "1-2",
            "--1",
            "1e5e5",
            "1.2.3",
            "e5",
            "NaN",
            "Infinity",
            "-Infinity",
            " 1",
            "0x10",
        ] {
            assert!(!json_number(n.as_bytes()), "{n}");
        }
        // Anything else in a number column becomes a string: the output stays JSON.
        let t = T {
            cols: vec![("n", 1700), ("i", 23)],
            rows: vec![vec![Some(b"01"), Some(b"1-2")]],
        };
        let mut out = Vec::new();
        json(&t, &mut out);
        assert_eq!(out, br#"[{"n":"01","i":"1-2"}]"#);
    }

    #[test]
    fn csv_one_empty_field_is_not_an_empty_line() {
        let t = T {
            cols: vec![("v", 25)],
            rows: vec![vec![Some(b"a")], vec![None], vec![Some(b"")], vec![Some(b"b")]],
        };
        let mut out = Vec::new();
        csv(&t, &mut out);
        assert_eq!(out, b"v\r\na\r\n\"\"\r\n\"\"\r\nb\r\n");
        // With more columns an empty field stays empty.
        let t = T {
            cols: vec![("a", 25), ("b", 25)],
            rows: vec![vec![None, Some(b"")]],
        };
        let mut out = Vec::new();
        csv(&t, &mut out);
        assert_eq!(out, b"a,b\r\n,\r\n");
    }

    #[test]
    fn json_escapes_control_and_invalid_bytes() {
        let mut out = Vec::new();
        json_string(&mut out, b"\x01\t\xff\\");
        assert_eq!(String::from_utf8(out).unwrap(), "\"\\u0001\\t\u{fffd}\\\\\"");
    }

    #[test]
    fn csv_rfc4180() {
        let mut out = Vec::new();
        csv(&sample(), &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "id,name,ok,doc,n\r\n1,\"a \"\"quoted\"\", line\nbreak\",t,\"{\"\"x\"\": [1]}\",1.50\r\n2,,f,,NaN\r\n"
        );
    }
}

/// The formats a result can be streamed in, row by row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamFormat {
    Rds,
    Json,
    Csv,
    Text,
}

/// Writes a result set as its rows arrive: `begin` with the columns (taken
/// from the first row's result), `row` for each, `end` once. The bytes are
/// the same as the whole-result encoders give.
#[derive(Debug, Clone)]
pub struct Stream {
    format: StreamFormat,
    rows: u64,
    /// The result has columns: RDS has a row list only then.
    row_list: bool,
}

impl Stream {
    pub fn new(format: StreamFormat) -> Stream {
        Stream {
            format,
            rows: 0,
            row_list: false,
        }
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }

    pub fn begin<R: ResultSet + ?Sized>(&mut self, rs: &R, out: &mut Vec<u8>) -> Result<(), crate::rds::RdsError> {
        match self.format {
            StreamFormat::Rds => {
                let header = crate::rds::Header {
                    driver_errcode: 2,
                    ..Default::default()
                };
                crate::rds::encode_prefix(&header, rs, out)?;
                self.row_list = rs.columns() > 0;
            }
            StreamFormat::Json => out.push(b'['),
            StreamFormat::Csv => csv_header(rs, out),
            StreamFormat::Text => {}
        }
        Ok(())
    }

    /// Appends every row of `rs` (a single-row result has one).
    pub fn rows_of<R: ResultSet + ?Sized>(&mut self, rs: &R, out: &mut Vec<u8>) -> Result<(), crate::rds::RdsError> {
        for r in 0..rs.rows() {
            match self.format {
                // Rows without columns (`select from t`) are counted, not written.
                StreamFormat::Rds if !self.row_list => {}
                StreamFormat::Rds => crate::rds::encode_row(rs, r, out)?,
                StreamFormat::Json => {
                    if self.rows > 0 {
                        out.push(b',');
                    }
                    json_row(rs, r, out);
                }
                StreamFormat::Csv => csv_row(rs, r, out),
                StreamFormat::Text => text_row(rs, r, out),
            }
            self.rows += 1;
        }
        Ok(())
    }

    pub fn end(&mut self, out: &mut Vec<u8>) {
        match self.format {
            StreamFormat::Rds if self.row_list => out.push(0),
            StreamFormat::Rds => {}
            StreamFormat::Json => out.push(b']'),
            StreamFormat::Csv | StreamFormat::Text => {}
        }
    }
}

#[cfg(test)]
mod stream_tests {
    use super::*;

    struct Rows(Vec<Vec<Option<&'static [u8]>>>);
    impl ResultSet for Rows {
        fn columns(&self) -> usize {
            2
        }
        fn rows(&self) -> usize {
            self.0.len()
        }
        fn column_name(&self, c: usize) -> &[u8] {
            [&b"id"[..], b"name"][c]
        }
        fn column_type(&self, c: usize) -> u32 {
            [23, 25][c]
        }
        fn value(&self, r: usize, c: usize) -> Option<&[u8]> {
            self.0[r][c]
        }
    }

    fn all() -> Rows {
        Rows(vec![
            vec![Some(b"1"), Some(b"a,\"b\"")],
            vec![Some(b"2"), None],
            vec![Some(b"3"), Some(b"")],
        ])
    }

    /// Streaming row by row gives the bytes of the whole-result encoders.
    #[test]
    fn streamed_equals_whole() {
        let whole = all();
        for format in [
            StreamFormat::Rds,
            StreamFormat::Json,
            StreamFormat::Csv,
            StreamFormat::Text,
        ] {
            let mut s = Stream::new(format);
            let mut out = Vec::new();
            s.begin(&whole, &mut out).unwrap();
            for row in &whole.0 {
                s.rows_of(&Rows(vec![row.clone()]), &mut out).unwrap();
            }
            s.end(&mut out);
            let mut want = Vec::new();
            match format {
                StreamFormat::Rds => {
                    let h = crate::rds::Header {
                        driver_errcode: 2,
                        ..Default::default()
                    };
                    crate::rds::encode(&h, &crate::rds::Body::Rows(&whole), &mut want).unwrap();
                }
                StreamFormat::Json => json(&whole, &mut want),
                StreamFormat::Csv => csv(&whole, &mut want),
                StreamFormat::Text => text(&whole, &mut want),
            }
            assert_eq!(out, want, "{format:?}");
            assert_eq!(s.rows(), 3);
        }
    }

    /// `select from t`: rows of no columns. RDS has no row list then.
    struct NoColumns(usize);
    impl ResultSet for NoColumns {
        fn columns(&self) -> usize {
            0
        }
        fn rows(&self) -> usize {
            self.0
        }
        fn column_name(&self, _: usize) -> &[u8] {
            b""
        }
        fn column_type(&self, _: usize) -> u32 {
            0
        }
        fn value(&self, _: usize, _: usize) -> Option<&[u8]> {
            None
        }
    }

    #[test]
    fn rows_without_columns_stream_as_valid_rds() {
        let mut s = Stream::new(StreamFormat::Rds);
        let mut out = Vec::new();
        s.begin(&NoColumns(1), &mut out).unwrap();
        for _ in 0..3 {
            s.rows_of(&NoColumns(1), &mut out).unwrap();
        }
        s.end(&mut out);
        assert_eq!(s.rows(), 3);
        let mut want = Vec::new();
        let h = crate::rds::Header {
            driver_errcode: 2,
            ..Default::default()
        };
        crate::rds::encode(&h, &crate::rds::Body::Rows(&NoColumns(3)), &mut want).unwrap();
        assert_eq!(out, want);
        let d = crate::rds::decode(&out).unwrap();
        assert!(d.columns.is_empty() && d.rows.is_empty());
    }
}
