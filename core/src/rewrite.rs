//! `sqldb_rewrite`: the status of a response from what the query did.
//!
//! The rules are grouped by condition, in the order each condition first
//! appears; the first condition that holds and has a rule for the request
//! (one that lists its method, else one without methods) gives the status.
//! This is the established C module's order, so its configurations behave
//! the same.

use crate::method::parse_methods;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    NoChanges,
    Changes,
    NoRows,
    Rows,
}

impl Condition {
    /// A condition's name as the directive takes it (any letter case).
    pub fn parse(name: &[u8]) -> Option<Condition> {
        [
            ("no_changes", Condition::NoChanges),
            ("changes", Condition::Changes),
            ("no_rows", Condition::NoRows),
            ("rows", Condition::Rows),
        ]
        .into_iter()
        .find(|(n, _)| n.as_bytes().eq_ignore_ascii_case(name))
        .map(|(_, c)| c)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// nginx method bits; 0 for every method.
    pub methods: u32,
    pub condition: Condition,
    pub status: u16,
    /// `=code`: the result stays the body, whatever the code.
    pub keep_body: bool,
}

/// What a result tells the conditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// Rows returned (0 for a statement without rows).
    pub rows: u64,
    /// Rows changed, from the command tag of a statement other than SELECT
    /// that has a count (INSERT ... RETURNING included); None otherwise.
    pub affected: Option<u64>,
}

impl Facts {
    fn hold(&self, c: Condition) -> bool {
        match c {
            Condition::Rows => self.rows > 0,
            Condition::NoRows => self.rows == 0,
            Condition::Changes => self.affected.is_some_and(|n| n > 0),
            Condition::NoChanges => self.affected == Some(0),
        }
    }
}

/// `[METHOD ...] CONDITION [=]CODE`: a rule, or why it is not one.
pub fn parse_rule<'a, I>(args: I) -> Result<Rule, String>
where
    I: IntoIterator<Item = &'a [u8]>,
{
    let args: Vec<&[u8]> = args.into_iter().collect();
    let n = args.len();
    if n < 2 {
        return Err("needs a condition and a status".into());
    }
    let condition =
        Condition::parse(args[n - 2]).ok_or_else(|| format!("invalid condition \"{}\"", lossy(args[n - 2])))?;
    let code = args[n - 1];
    let (keep_body, digits) = match code.strip_prefix(b"=") {
        Some(d) => (true, d),
        None => (false, code),
    };
    let status = std::str::from_utf8(digits)
        .ok()
        .filter(|d| d.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|d| d.parse::<u16>().ok())
        .filter(|s| (200..=599).contains(s))
        .ok_or_else(|| format!("invalid status \"{}\"", lossy(code)))?;
    let methods = parse_methods(args[..n - 2].iter().copied()).map_err(|e| e.to_string())?;
    Ok(Rule {
        methods,
        condition,
        status,
        keep_body,
    })
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The rule that sets the status of a request with `method`, if any.
pub fn choose(rules: &[Rule], method: u32, facts: Facts) -> Option<&Rule> {
    let mut seen: Vec<Condition> = Vec::new();
    for first in rules {
        let c = first.condition;
        if seen.contains(&c) {
            continue;
        }
        seen.push(c);
        if !facts.hold(c) {
            continue;
        }
        let mut of_condition = rules.iter().filter(|r| r.condition == c);
        let by_method = of_condition.clone().find(|r| r.methods & method != 0);
        if let Some(r) = by_method.or_else(|| of_condition.find(|r| r.methods == 0)) {
            return Some(r);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const GET: u32 = 0x2;
    const POST: u32 = 0x8;

    fn rule(args: &str) -> Rule {
        parse_rule(args.split(' ').map(str::as_bytes)).unwrap()
    }

    fn status(rules: &[Rule], method: u32, rows: u64, affected: Option<u64>) -> Option<u16> {
        choose(rules, method, Facts { rows, affected }).map(|r| r.status)
    }

    #[test]
    fn parsing() {
        assert_eq!(
            rule("GET POST no_rows =404"),
            Rule {
                methods: GET | POST,
                condition: Condition::NoRows,
                status: 404,
                keep_body: true
            }
        );
        assert_eq!(rule("ROWS 201").condition, Condition::Rows);
        assert_eq!(rule("get rows 201").methods, GET);
        for bad in [
            "rows 99",
            "rows 600",
            "rows abc",
            "rows =",
            "sometimes 200",
            "FETCH rows 200",
            "rows +201",
        ] {
            assert!(parse_rule(bad.split(' ').map(str::as_bytes)).is_err(), "{bad}");
        }
        assert_eq!(
            parse_rule(["rows".as_bytes(), b"99"]).unwrap_err(),
            "invalid status \"99\""
        );
    }

    #[test]
    fn statements_without_rows_have_no_rows() {
        let rules = [rule("no_rows 410")];
        assert_eq!(status(&rules, GET, 0, Some(0)), Some(410));
        assert_eq!(status(&rules, GET, 2, None), None);
    }

    #[test]
    fn changes_count_for_every_statement_with_a_count() {
        let rules = [rule("changes 201"), rule("no_changes 410")];
        // INSERT ... RETURNING: rows and a count.
        assert_eq!(status(&rules, POST, 1, Some(1)), Some(201));
        assert_eq!(status(&rules, POST, 0, Some(0)), Some(410));
        // SELECT and DDL: no count, neither holds.
        assert_eq!(status(&rules, GET, 3, None), None);
        assert_eq!(status(&rules, GET, 0, None), None);
    }

    #[test]
    fn a_method_rule_beats_the_default_of_its_condition() {
        let rules = [rule("rows 206"), rule("GET rows 201")];
        assert_eq!(status(&rules, GET, 1, None), Some(201));
        assert_eq!(status(&rules, POST, 1, None), Some(206));
    }

    #[test]
    fn conditions_in_order_of_first_appearance() {
        let rules = [rule("POST no_rows 404"), rule("changes 201"), rule("no_rows 410")];
        // no_rows comes first; for GET its default rule applies.
        assert_eq!(status(&rules, GET, 0, Some(3)), Some(410));
        assert_eq!(status(&rules, POST, 0, Some(3)), Some(404));
        // A condition that holds but has no rule for the method: the next one.
        let rules = [rule("POST rows 201"), rule("changes 202")];
        assert_eq!(status(&rules, GET, 1, Some(1)), Some(202));
    }
}
