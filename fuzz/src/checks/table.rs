//! Result sets built from fuzz input, for the encoders.

use crate::source::Source;
use gateway_core::rds::ResultSet;

pub type Row = Vec<Option<Vec<u8>>>;

#[derive(Debug, Clone, Default)]
pub struct Table {
    /// (name, type OID)
    pub columns: Vec<(Vec<u8>, u32)>,
    pub rows: Vec<Row>,
}

impl ResultSet for Table {
    fn columns(&self) -> usize {
        self.columns.len()
    }
    fn rows(&self) -> usize {
        self.rows.len()
    }
    fn column_name(&self, col: usize) -> &[u8] {
        &self.columns[col].0
    }
    fn column_type(&self, col: usize) -> u32 {
        self.columns[col].1
    }
    fn value(&self, row: usize, col: usize) -> Option<&[u8]> {
        self.rows[row][col].as_deref()
    }
}

/// Some rows of a table, as the streaming side sees each result.
pub struct Slice<'a> {
    pub table: &'a Table,
    pub rows: std::ops::Range<usize>,
}

impl ResultSet for Slice<'_> {
    fn columns(&self) -> usize {
        self.table.columns()
    }
    fn rows(&self) -> usize {
        self.rows.len()
    }
    fn column_name(&self, col: usize) -> &[u8] {
        self.table.column_name(col)
    }
    fn column_type(&self, col: usize) -> u32 {
        self.table.column_type(col)
    }
    fn value(&self, row: usize, col: usize) -> Option<&[u8]> {
        self.table.value(self.rows.start + row, col)
    }
}

/// Type OIDs the encoders treat apart, and a few others.
pub const OIDS: &[u32] = &[
    16,
    17,
    18,
    19,
    20,
    21,
    23,
    25,
    26,
    114,
    142,
    700,
    701,
    1043,
    1082,
    1083,
    1114,
    1184,
    1186,
    1266,
    1560,
    1562,
    1700,
    3802,
    705,
    65535,
    65536 + 23,
    0xFFFF_FFFF,
];

/// Bytes with the ones that matter to the formats made likely.
pub fn cell_bytes(src: &mut Source, max: usize) -> Vec<u8> {
    const LIKELY: &[&[u8]] = &[
        b",",
        b"\"",
        b"\r",
        b"\n",
        b"\r\n",
        b"\\",
        b"\0",
        b"\x01",
        b"\x1f",
        b"\xff",
        b"\xc3\xa9",
        b"\xe2\x80\xa8",
        b"\xf0\x9f\x98\x80",
        b"\xed\xa0\x80",
        b"t",
        b"f",
        b"-",
        b"1",
        b".",
        b"e",
        b"+",
        b"NaN",
        b"Infinity",
    ];
    let mut v = Vec::new();
    for _ in 0..src.below(max + 1) {
        let b = src.byte();
        if b >= 0xa0 {
            v.extend_from_slice(LIKELY[b as usize % LIKELY.len()]);
        } else {
            v.push(b);
        }
    }
    v
}

/// Text PostgreSQL could send for a number column, or something that is not a number.
fn number_text(src: &mut Source) -> Vec<u8> {
    const SAMPLES: &[&str] = &[
        "0",
        "-0",
        "7",
        "-42",
        "1.50",
        "0.001",
        "1e+100",
        "1.5e-07",
        "-1E5",
        "NaN",
        "Infinity",
        "-Infinity",
        "123456789012345678901234567890",
        "1e400",
        "00",
        "01",
        "1.",
        ".5",
        "-",
        "+1",
        "1e",
        "1-2",
        "--1",
        "1e5e5",
        "1.2.3",
        "e5",
        "-.5",
        "0x10",
    ];
    if src.bool() {
        src.pick(SAMPLES).as_bytes().to_vec()
    } else {
        let mut v = Vec::new();
        for _ in 0..src.below(8) {
            v.push(src.pick(b"0123456789-+.eE"));
        }
        v
    }
}

/// JSON text as a json or jsonb column holds it (valid), with spacing.
fn json_text(src: &mut Source, out: &mut Vec<u8>, depth: u32) {
    let space = |src: &mut Source, out: &mut Vec<u8>| {
        if src.below(4) == 0 {
            out.push(src.pick(b" \t\n\r"));
        }
    };
    space(src, out);
    match src.below(if depth == 0 { 5 } else { 7 }) {
        0 => out.extend_from_slice(src.pick(&[&b"null"[..], b"true", b"false"])),
        1 => out.extend_from_slice(
            src.pick(&["0", "-1", "2.5e3", "1e400", "123456789012345678901234567890"])
                .as_bytes(),
        ),
        2 | 3 => {
            let s = String::from_utf8_lossy(&cell_bytes(src, 6)).into_owned();
            out.extend_from_slice(serde_json::to_string(&s).unwrap().as_bytes());
        }
        4 => out.extend_from_slice(br#""\u00e9\n\"""#),
        5 => {
            out.push(b'[');
            for i in 0..src.below(4) {
                if i > 0 {
                    out.push(b',');
                }
                json_text(src, out, depth - 1);
            }
            out.push(b']');
        }
        _ => {
            out.push(b'{');
            for i in 0..src.below(4) {
                if i > 0 {
                    out.push(b',');
                }
                let k = String::from_utf8_lossy(&cell_bytes(src, 3)).into_owned();
                out.extend_from_slice(serde_json::to_string(&k).unwrap().as_bytes());
                out.push(b':');
                json_text(src, out, depth - 1);
            }
            out.push(b'}');
        }
    }
    space(src, out);
}

/// A cell of a column of type `oid`, or NULL.
fn cell(src: &mut Source, oid: u32) -> Option<Vec<u8>> {
    if src.below(5) == 0 {
        return None;
    }
    Some(match oid {
        20 | 21 | 23 | 26 | 700 | 701 | 1700 => number_text(src),
        16 if src.below(4) != 0 => src.pick(&[&b"t"[..], b"f"]).to_vec(),
        114 | 3802 => {
            let mut v = Vec::new();
            json_text(src, &mut v, 3);
            v
        }
        _ => cell_bytes(src, 10),
    })
}

pub fn table(src: &mut Source) -> Table {
    let cols = src.below(5);
    let mut t = Table::default();
    for _ in 0..cols {
        let name = match src.below(4) {
            0 => src.pick(&[&b"id"[..], b"?column?", b"a"]).to_vec(),
            _ => cell_bytes(src, 5),
        };
        let oid = if src.below(8) == 0 { src.u32() } else { src.pick(OIDS) };
        t.columns.push((name, oid));
    }
    for _ in 0..src.below(6) {
        let row = t.columns.iter().map(|&(_, oid)| cell(src, oid)).collect();
        t.rows.push(row);
    }
    t
}
