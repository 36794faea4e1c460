//! The table's renderings for a scrape: Prometheus's text exposition
//! format 0.0.4, and the same series as JSON.

use std::fmt::Write as _;

use super::{Kind, Table, BUCKETS_US, FAMILIES};

impl Table<'_> {
    /// Prometheus's text exposition format 0.0.4.
    pub fn prometheus(&self) -> String {
        let snap = self.snapshot();
        let mut out = String::new();
        for (fi, f) in FAMILIES.iter().enumerate() {
            let rows: Vec<_> = snap.iter().filter(|r| r.0 == fi as u32).collect();
            let name = format!("ngx_gateway_{}", f.name);
            let _ = writeln!(out, "# HELP {name} {}", f.help);
            let kind = match f.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Histogram => "histogram",
            };
            let _ = writeln!(out, "# TYPE {name} {kind}");
            if f.kind != Kind::Histogram {
                for (_, _, labels, value) in &rows {
                    let _ = writeln!(out, "{name}{} {value}", label_text(f.labels, labels, None));
                }
                if rows.is_empty() && f.labels.is_empty() {
                    let _ = writeln!(out, "{name} 0");
                }
                continue;
            }
            for series in histogram_series(&rows) {
                let mut cumulative = 0;
                for (i, bound) in BUCKETS_US.iter().map(Some).chain([None]).enumerate() {
                    cumulative += series.buckets[i];
                    let le = bound.map_or("+Inf".to_owned(), |b| seconds(*b));
                    let _ = writeln!(
                        out,
                        "{name}_bucket{} {cumulative}",
                        label_text(f.labels, &series.labels, Some(&le))
                    );
                }
                let l = label_text(f.labels, &series.labels, None);
                let _ = writeln!(out, "{name}_sum{l} {}", seconds(series.sum));
                let _ = writeln!(out, "{name}_count{l} {}", series.count);
            }
        }
        out
    }

    /// The same series as JSON: one object per family.
    pub fn json(&self) -> String {
        let snap = self.snapshot();
        let mut out = String::from("{");
        for (fi, f) in FAMILIES.iter().enumerate() {
            let rows: Vec<_> = snap.iter().filter(|r| r.0 == fi as u32).collect();
            if fi > 0 {
                out.push(',');
            }
            let _ = write!(out, "\"ngx_gateway_{}\":{{\"help\":", f.name);
            json_str(&mut out, f.help);
            let kind = match f.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Histogram => "histogram",
            };
            let _ = write!(out, ",\"type\":\"{kind}\",\"series\":[");
            let mut first = true;
            let mut sep = |out: &mut String| {
                if !first {
                    out.push(',');
                }
                first = false;
            };
            if f.kind == Kind::Histogram {
                for series in histogram_series(&rows) {
                    sep(&mut out);
                    out.push_str("{\"labels\":");
                    json_labels(&mut out, f.labels, &series.labels);
                    out.push_str(",\"buckets\":{");
                    let mut cumulative = 0;
                    for (i, bound) in BUCKETS_US.iter().map(Some).chain([None]).enumerate() {
                        cumulative += series.buckets[i];
                        if i > 0 {
                            out.push(',');
                        }
                        let le = bound.map_or("+Inf".to_owned(), |b| seconds(*b));
                        let _ = write!(out, "\"{le}\":{cumulative}");
                    }
                    let _ = write!(out, "}},\"sum\":{},\"count\":{}}}", seconds(series.sum), series.count);
                }
            } else {
                for (_, _, labels, value) in &rows {
                    sep(&mut out);
                    out.push_str("{\"labels\":");
                    json_labels(&mut out, f.labels, labels);
                    let _ = write!(out, ",\"value\":{value}}}");
                }
                if rows.is_empty() && f.labels.is_empty() {
                    out.push_str("{\"labels\":{},\"value\":0}");
                }
            }
            out.push_str("]}");
        }
        out.push('}');
        out
    }
}

struct Histogram {
    labels: Vec<String>,
    sum: i64,
    count: i64,
    buckets: [i64; BUCKETS_US.len() + 1],
}

fn histogram_series(rows: &[&(u32, u32, Vec<String>, i64)]) -> Vec<Histogram> {
    let mut out: Vec<Histogram> = Vec::new();
    for (_, part, labels, value) in rows {
        let at = match out.iter().position(|h| &h.labels == labels) {
            Some(i) => i,
            None => {
                out.push(Histogram {
                    labels: labels.clone(),
                    sum: 0,
                    count: 0,
                    buckets: [0; BUCKETS_US.len() + 1],
                });
                out.len() - 1
            }
        };
        let h = &mut out[at];
        match *part {
            0 => h.sum = *value,
            1 => h.count = *value,
            p => {
                if let Some(b) = h.buckets.get_mut(p as usize - 2) {
                    *b = *value;
                }
            }
        }
    }
    out
}

/// Microseconds as seconds, without trailing zeros.
fn seconds(us: i64) -> String {
    let sign = if us < 0 { "-" } else { "" };
    let us = us.unsigned_abs();
    let (whole, frac) = (us / 1_000_000, us % 1_000_000);
    if frac == 0 {
        return format!("{sign}{whole}");
    }
    let f = format!("{frac:06}");
    format!("{sign}{whole}.{}", f.trim_end_matches('0'))
}

/// `{name="value",...}` with Prometheus's escapes; empty without labels.
fn label_text(names: &[&str], values: &[String], le: Option<&str>) -> String {
    let mut pairs: Vec<(String, String)> = names
        .iter()
        .zip(values.iter().chain(std::iter::repeat(&String::new())))
        .map(|(n, v)| (n.to_string(), v.clone()))
        .collect();
    if let Some(le) = le {
        pairs.push(("le".into(), le.into()));
    }
    if pairs.is_empty() {
        return String::new();
    }
    let mut out = String::from("{");
    for (i, (n, v)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{n}=\"");
        for c in v.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push('}');
    out
}

fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn json_labels(out: &mut String, names: &[&str], values: &[String]) {
    out.push('{');
    for (i, (n, v)) in names.iter().zip(values).enumerate() {
        if i > 0 {
            out.push(',');
        }
        json_str(out, n);
        out.push(':');
        json_str(out, v);
    }
    out.push('}');
}
