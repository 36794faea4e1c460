//! The RDS ("Resty DBD Stream") binary result format, version 0.0.3.
//!
//! Layout, integers in the byte order announced by the first byte (we write
//! little endian, byte 0):
//!
//! ```text
//! header:  endian u8 | version u32 | result type u8 | std errcode u16
//!          | driver errcode u16 | errstr len u16 | errstr | affected u64
//!          | insert id u64 | col count u16
//! column:  std type u16 | driver type u16 | name len u16 | name
//! row:     1 u8 | per column: len u32 (0xFFFFFFFF = NULL) | bytes
//! end:     0 u8            (the row list exists only when there are columns)
//! ```

use byteorder::{ByteOrder, LittleEndian};
use std::fmt;

pub const VERSION: u32 = 3;
/// The length that marks a NULL field.
pub const NULL_LEN: u32 = u32::MAX;

/// The RDS "std" column type of a PostgreSQL type OID.
pub fn std_type(oid: u32) -> u16 {
    match oid {
        20 => 0x0001,             // bigint
        1560 => 0x8002,           // bit
        1562 => 0x8003,           // bit varying
        16 => 0xC004,             // bool
        18 => 0x8005,             // char
        19 | 25 | 1043 => 0x8006, // name, text, varchar
        1082 => 0x8007,           // date
        701 => 0x4008,            // double
        23 => 0x0009,             // integer
        1186 => 0x400A,           // interval
        1700 => 0x400B,           // decimal
        700 => 0x400C,            // real
        21 => 0x000D,             // smallint
        1266 => 0x800E,           // time with time zone
        1083 => 0x800F,           // time
        1184 => 0x8010,           // timestamp with time zone
        1114 => 0x8011,           // timestamp
        142 => 0x8012,            // xml
        17 => 0x8013,             // bytea
        _ => 0x8000,              // unknown
    }
}

/// A result set as the encoder reads it: column metadata and text cells.
pub trait ResultSet {
    fn columns(&self) -> usize;
    fn rows(&self) -> usize;
    fn column_name(&self, col: usize) -> &[u8];
    /// The driver's type code (the PostgreSQL type OID).
    fn column_type(&self, col: usize) -> u32;
    /// The cell as text, `None` for NULL.
    fn value(&self, row: usize, col: usize) -> Option<&[u8]>;
    /// The cell's length, `None` for NULL (a driver may know it without
    /// fetching the value).
    fn value_len(&self, row: usize, col: usize) -> Option<usize> {
        self.value(row, col).map(<[u8]>::len)
    }
}

/// The fixed part before the columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header<'a> {
    pub std_errcode: u16,
    pub driver_errcode: u16,
    pub errstr: &'a [u8],
    pub affected_rows: u64,
    pub insert_id: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RdsError {
    TooManyColumns(usize),
    ColumnNameTooLong(usize),
    ErrstrTooLong(usize),
    ValueTooLong { row: usize, col: usize, len: usize },
}

impl fmt::Display for RdsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RdsError::TooManyColumns(n) => write!(f, "{n} columns do not fit in RDS (at most 65535)"),
            RdsError::ColumnNameTooLong(c) => write!(f, "name of column {c} is longer than 65535 bytes"),
            RdsError::ErrstrTooLong(n) => write!(f, "error text of {n} bytes is longer than 65535 bytes"),
            RdsError::ValueTooLong { row, col, len } => {
                write!(
                    f,
                    "value at row {row} column {col} has {len} bytes, more than RDS can carry"
                )
            }
        }
    }
}

impl std::error::Error for RdsError {}

const HEADER_FIXED: usize = 1 + 4 + 1 + 2 + 2 + 2 + 8 + 8 + 2;

fn u16_len(len: usize, err: impl FnOnce(usize) -> RdsError) -> Result<u16, RdsError> {
    u16::try_from(len).map_err(|_| err(len))
}

/// What a result contributes besides the header: rows with columns, or
/// nothing at all (a statement such as UPDATE that returns no rows).
pub enum Body<'r, R: ResultSet + ?Sized> {
    Rows(&'r R),
    NoRows,
}

/// The exact encoded size, checking every length on the way.
pub fn encoded_len<R: ResultSet + ?Sized>(header: &Header<'_>, body: &Body<'_, R>) -> Result<usize, RdsError> {
    u16_len(header.errstr.len(), RdsError::ErrstrTooLong)?;
    let mut len = HEADER_FIXED + header.errstr.len();
    let Body::Rows(rs) = body else {
        return Ok(len);
    };
    let cols = rs.columns();
    u16_len(cols, RdsError::TooManyColumns)?;
    for c in 0..cols {
        let name = rs.column_name(c).len();
        u16_len(name, |_| RdsError::ColumnNameTooLong(c))?;
        len += 6 + name;
    }
    if cols > 0 {
        for r in 0..rs.rows() {
            len += 1;
            for c in 0..cols {
                len += 4;
                if let Some(n) = rs.value_len(r, c) {
                    if n >= NULL_LEN as usize {
                        return Err(RdsError::ValueTooLong { row: r, col: c, len: n });
                    }
                    len += n;
                }
            }
        }
        len += 1;
    }
    Ok(len)
}

fn put_u16(out: &mut Vec<u8>, v: u16) {
    let mut b = [0; 2];
    LittleEndian::write_u16(&mut b, v);
    out.extend_from_slice(&b);
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    let mut b = [0; 4];
    LittleEndian::write_u32(&mut b, v);
    out.extend_from_slice(&b);
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    let mut b = [0; 8];
    LittleEndian::write_u64(&mut b, v);
    out.extend_from_slice(&b);
}

/// Encodes the whole stream, appending to `out`; returns the bytes written
/// (`encoded_len`'s). Each value is asked for once; on an error `out` is
/// left as it was.
pub fn encode<R: ResultSet + ?Sized>(
    header: &Header<'_>,
    body: &Body<'_, R>,
    out: &mut Vec<u8>,
) -> Result<usize, RdsError> {
    let start = out.len();
    // Room for the header and for rows of short values; longer ones grow it.
    let rows = match body {
        Body::Rows(rs) => rs.rows().saturating_mul(1 + rs.columns().saturating_mul(12)),
        Body::NoRows => 0,
    };
    out.reserve(HEADER_FIXED + header.errstr.len() + rows.min(1 << 20));
    let written = match body {
        Body::NoRows => encode_prefix(header, &NoColumns, out),
        Body::Rows(rs) => encode_prefix(header, *rs, out).and_then(|()| {
            if rs.columns() > 0 {
                for r in 0..rs.rows() {
                    encode_row(*rs, r, out)?;
                }
                out.push(0);
            }
            Ok(())
        }),
    };
    if let Err(e) = written {
        out.truncate(start);
        return Err(e);
    }
    Ok(out.len() - start)
}

/// A statement without rows: no columns.
struct NoColumns;

impl ResultSet for NoColumns {
    fn columns(&self) -> usize {
        0
    }
    fn rows(&self) -> usize {
        0
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

/// The header and the column list of a result set, for streaming its rows.
pub fn encode_prefix<R: ResultSet + ?Sized>(header: &Header<'_>, rs: &R, out: &mut Vec<u8>) -> Result<(), RdsError> {
    u16_len(header.errstr.len(), RdsError::ErrstrTooLong)?;
    let cols = rs.columns();
    u16_len(cols, RdsError::TooManyColumns)?;
    for c in 0..cols {
        u16_len(rs.column_name(c).len(), |_| RdsError::ColumnNameTooLong(c))?;
    }
    out.push(0);
    put_u32(out, VERSION);
    out.push(0);
    put_u16(out, header.std_errcode);
    put_u16(out, header.driver_errcode);
    put_u16(out, header.errstr.len() as u16);
    out.extend_from_slice(header.errstr);
    put_u64(out, header.affected_rows);
    put_u64(out, header.insert_id);
    put_u16(out, cols as u16);
    for c in 0..cols {
        let oid = rs.column_type(c);
        put_u16(out, std_type(oid));
        put_u16(out, oid as u16);
        let name = rs.column_name(c);
        put_u16(out, name.len() as u16);
        out.extend_from_slice(name);
    }
    Ok(())
}

/// One row record (after `encode_prefix`; the list ends with a 0 byte).
pub fn encode_row<R: ResultSet + ?Sized>(rs: &R, row: usize, out: &mut Vec<u8>) -> Result<(), RdsError> {
    out.push(1);
    for c in 0..rs.columns() {
        match rs.value(row, c) {
            None => put_u32(out, NULL_LEN),
            Some(v) => {
                if v.len() >= NULL_LEN as usize {
                    return Err(RdsError::ValueTooLong {
                        row,
                        col: c,
                        len: v.len(),
                    });
                }
                put_u32(out, v.len() as u32);
                out.extend_from_slice(v);
            }
        }
    }
    Ok(())
}

/// A decoded stream: what a client of the gateway sees. Used by tests.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Decoded {
    pub std_errcode: u16,
    pub driver_errcode: u16,
    pub errstr: Vec<u8>,
    pub affected_rows: u64,
    pub insert_id: u64,
    /// (std type, driver type, name)
    pub columns: Vec<(u16, u16, Vec<u8>)>,
    pub rows: Vec<Vec<Option<Vec<u8>>>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    Truncated,
    BadEndian(u8),
    BadVersion(u32),
    BadRowFlag(u8),
    TrailingBytes(usize),
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(LittleEndian::read_u16(self.take(2)?))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(LittleEndian::read_u32(self.take(4)?))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(LittleEndian::read_u64(self.take(8)?))
    }
}

/// Decodes a little-endian stream, checking that nothing trails it.
pub fn decode(buf: &[u8]) -> Result<Decoded, DecodeError> {
    let mut r = Reader { buf };
    let endian = r.u8()?;
    if endian != 0 {
        return Err(DecodeError::BadEndian(endian));
    }
    let version = r.u32()?;
    if version != VERSION {
        return Err(DecodeError::BadVersion(version));
    }
    let _result_type = r.u8()?;
    let mut d = Decoded {
        std_errcode: r.u16()?,
        driver_errcode: r.u16()?,
        ..Decoded::default()
    };
    let n = r.u16()? as usize;
    d.errstr = r.take(n)?.to_vec();
    d.affected_rows = r.u64()?;
    d.insert_id = r.u64()?;
    let cols = r.u16()? as usize;
    for _ in 0..cols {
        let std = r.u16()?;
        let drv = r.u16()?;
        let n = r.u16()? as usize;
        d.columns.push((std, drv, r.take(n)?.to_vec()));
    }
    if cols > 0 {
        loop {
            match r.u8()? {
                0 => break,
                1 => {
                    let mut row = Vec::with_capacity(cols);
                    for _ in 0..cols {
                        let len = r.u32()?;
                        row.push(if len == NULL_LEN {
                            None
                        } else {
                            Some(r.take(len as usize)?.to_vec())
                        });
                    }
                    d.rows.push(row);
                }
                f => return Err(DecodeError::BadRowFlag(f)),
            }
        }
    }
    if !r.buf.is_empty() {
        return Err(DecodeError::TrailingBytes(r.buf.len()));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Table<'a> {
        cols: Vec<(&'a str, u32)>,
        rows: Vec<Vec<Option<Vec<u8>>>>,
    }

    impl ResultSet for Table<'_> {
        fn columns(&self) -> usize {
            self.cols.len()
        }
        fn rows(&self) -> usize {
            self.rows.len()
        }
        fn column_name(&self, col: usize) -> &[u8] {
            self.cols[col].0.as_bytes()
        }
        fn column_type(&self, col: usize) -> u32 {
            self.cols[col].1
        }
        fn value(&self, row: usize, col: usize) -> Option<&[u8]> {
            self.rows[row][col].as_deref()
        }
    }

    fn tuples_header() -> Header<'static> {
        Header {
            driver_errcode: 2,
            ..Header::default()
        }
    }

    #[test]
    fn one_text_column_one_row_byte_for_byte() {
        let t = Table {
            cols: vec![("echo", 25)],
            rows: vec![vec![Some(b"default".to_vec())]],
        };
        let mut out = Vec::new();
        let n = encode(&tuples_header(), &Body::Rows(&t), &mut out).unwrap();
        let mut want = vec![0u8, 3, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0];
        want.extend_from_slice(&[0; 16]); // affected, insert id
        want.extend_from_slice(&[1, 0]); // one column
        want.extend_from_slice(&[0x06, 0x80, 25, 0, 4, 0]);
        want.extend_from_slice(b"echo");
        want.extend_from_slice(&[1, 7, 0, 0, 0]);
        want.extend_from_slice(b"default");
        want.push(0);
        assert_eq!(out, want);
        assert_eq!(n, want.len());
    }

    #[test]
    fn nulls_empties_and_many_columns_round_trip() {
        let t = Table {
            cols: vec![("a", 23), ("b", 25), ("c", 16), ("d", 99999)],
            rows: vec![
                vec![Some(b"1".to_vec()), None, Some(b"t".to_vec()), Some(Vec::new())],
                vec![None, Some(b"x\0y".to_vec()), None, Some(vec![0xff; 300])],
            ],
        };
        let mut out = Vec::new();
        encode(&tuples_header(), &Body::Rows(&t), &mut out).unwrap();
        let d = decode(&out).unwrap();
        assert_eq!(d.driver_errcode, 2);
        assert_eq!(
            d.columns,
            vec![
                (0x0009, 23, b"a".to_vec()),
                (0x8006, 25, b"b".to_vec()),
                (0xC004, 16, b"c".to_vec()),
                (0x8000, 99999u32 as u16, b"d".to_vec())
            ]
        );
        assert_eq!(d.rows, t.rows);
    }

    #[test]
    fn empty_result_set_has_only_the_terminator() {
        let t = Table {
            cols: vec![("id", 23)],
            rows: vec![],
        };
        let mut out = Vec::new();
        encode(&tuples_header(), &Body::Rows(&t), &mut out).unwrap();
        assert_eq!(out.last(), Some(&0));
        assert_eq!(out.len(), HEADER_FIXED + 6 + 2 + 1);
        let d = decode(&out).unwrap();
        assert!(d.rows.is_empty());
        assert_eq!(d.columns.len(), 1);
    }

    #[test]
    fn statement_without_rows_has_no_row_list() {
        let h = Header {
            driver_errcode: 1,
            affected_rows: 3,
            ..Header::default()
        };
        let mut out = Vec::new();
        encode::<Table>(&h, &Body::NoRows, &mut out).unwrap();
        assert_eq!(out.len(), HEADER_FIXED);
        assert_eq!(&out[out.len() - 2..], &[0, 0]);
        let d = decode(&out).unwrap();
        assert_eq!((d.driver_errcode, d.affected_rows, d.columns.len()), (1, 3, 0));
    }

    #[test]
    fn errstr_is_carried() {
        let h = Header {
            std_errcode: 1,
            driver_errcode: 7,
            errstr: b"boom",
            ..Header::default()
        };
        let mut out = Vec::new();
        encode::<Table>(&h, &Body::NoRows, &mut out).unwrap();
        assert_eq!(decode(&out).unwrap().errstr, b"boom");
    }

    #[test]
    fn encode_writes_what_encoded_len_says_and_nothing_on_an_error() {
        let t = Table {
            cols: vec![("id", 23), ("label", 25)],
            rows: vec![
                vec![Some(b"1".to_vec()), Some(b"one".to_vec())],
                vec![None, Some(vec![b'x'; 5000])],
                vec![Some(Vec::new()), None],
            ],
        };
        let mut out = b"before".to_vec();
        let n = encode(&tuples_header(), &Body::Rows(&t), &mut out).unwrap();
        assert_eq!(Ok(n), encoded_len(&tuples_header(), &Body::Rows(&t)));
        assert_eq!(out.len(), 6 + n);
        assert_eq!(decode(&out[6..]).unwrap().rows.len(), 3);
        let long = Table {
            cols: vec![("v", 25)],
            rows: vec![vec![Some(b"ok".to_vec())], vec![Some(vec![0u8; NULL_LEN as usize])]],
        };
        let mut out = b"before".to_vec();
        assert_eq!(
            encode(&tuples_header(), &Body::Rows(&long), &mut out),
            Err(RdsError::ValueTooLong {
                row: 1,
                col: 0,
                len: NULL_LEN as usize
            })
        );
        assert_eq!(out, b"before");
    }

    #[test]
    fn limits_are_errors_not_truncation() {
        let long = "n".repeat(70000);
        let t = Table {
            cols: vec![(&long, 25)],
            rows: vec![],
        };
        assert_eq!(
            encoded_len(&tuples_header(), &Body::Rows(&t)),
            Err(RdsError::ColumnNameTooLong(0))
        );
        let big = vec![0u8; 70000];
        let h = Header {
            errstr: &big,
            ..Header::default()
        };
        assert_eq!(
            encoded_len::<Table>(&h, &Body::NoRows),
            Err(RdsError::ErrstrTooLong(70000))
        );
    }

    #[test]
    fn decoder_rejects_damage() {
        let t = Table {
            cols: vec![("v", 25)],
            rows: vec![vec![Some(b"abc".to_vec())]],
        };
        let mut out = Vec::new();
        encode(&tuples_header(), &Body::Rows(&t), &mut out).unwrap();
        assert_eq!(decode(&out[..out.len() - 1]), Err(DecodeError::Truncated));
        let mut extra = out.clone();
        extra.push(9);
        assert_eq!(decode(&extra), Err(DecodeError::TrailingBytes(1)));
        let mut flag = out.clone();
        let at = flag.len() - 1 - 3 - 4 - 1;
        flag[at] = 7;
        assert_eq!(decode(&flag), Err(DecodeError::BadRowFlag(7)));
    }

    #[test]
    fn type_map() {
        for (oid, std) in [
            (20, 0x0001),
            (21, 0x000D),
            (23, 0x0009),
            (700, 0x400C),
            (701, 0x4008),
            (1700, 0x400B),
            (16, 0xC004),
            (17, 0x8013),
            (19, 0x8006),
            (25, 0x8006),
            (1043, 0x8006),
            (18, 0x8005),
            (1082, 0x8007),
            (1083, 0x800F),
            (1114, 0x8011),
            (1184, 0x8010),
            (1186, 0x400A),
            (1266, 0x800E),
            (1560, 0x8002),
            (1562, 0x8003),
            (142, 0x8012),
            (705, 0x8000),
            (114, 0x8000),
        ] {
            assert_eq!(std_type(oid), std, "oid {oid}");
        }
    }
}
