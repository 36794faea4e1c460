//! HTTP method names as `sqldb_query` lists them, and the choice of the query
//! template for a request.

use std::fmt;

/// nginx's method bits (`NGX_HTTP_GET` ...), stable across nginx versions.
pub const METHODS: &[(&str, u32)] = &[
    ("GET", 0x0002),
    ("HEAD", 0x0004),
    ("POST", 0x0008),
    ("PUT", 0x0010),
    ("DELETE", 0x0020),
    ("MKCOL", 0x0040),
    ("COPY", 0x0080),
    ("MOVE", 0x0100),
    ("OPTIONS", 0x0200),
    ("PROPFIND", 0x0400),
    ("PROPPATCH", 0x0800),
    ("LOCK", 0x1000),
    ("UNLOCK", 0x2000),
    ("PATCH", 0x4000),
    ("TRACE", 0x8000),
];

/// The bit of one method name (any letter case, as the C module takes
/// them), if nginx knows it.
pub fn method_bit(name: &[u8]) -> Option<u32> {
    METHODS
        .iter()
        .find(|(n, _)| n.as_bytes().eq_ignore_ascii_case(name))
        .map(|&(_, bit)| bit)
}

/// The name of one method bit.
pub fn method_name(bit: u32) -> Option<&'static str> {
    METHODS.iter().find(|&&(_, b)| b == bit).map(|&(n, _)| n)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueryError {
    /// A name in the method list is not an HTTP method nginx knows.
    UnknownMethod(String),
    /// The same method appears twice in one list.
    RepeatedMethod(&'static str),
    /// A second template without a method list at the same level.
    DuplicateDefault,
    /// A method already has a template at the same level.
    DuplicateMethod(&'static str),
}

impl fmt::Display for QueryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueryError::UnknownMethod(m) => write!(f, "unknown HTTP method \"{m}\""),
            QueryError::RepeatedMethod(m) => write!(f, "method \"{m}\" is listed twice"),
            QueryError::DuplicateDefault => f.write_str("is duplicate: a default query is already set"),
            QueryError::DuplicateMethod(m) => {
                write!(f, "is duplicate: a query for method \"{m}\" is already set")
            }
        }
    }
}

/// Parses a method list (the arguments before the template) into a bit mask.
pub fn parse_methods<'a, I>(names: I) -> Result<u32, QueryError>
where
    I: IntoIterator<Item = &'a [u8]>,
{
    let mut mask = 0;
    for name in names {
        let bit =
            method_bit(name).ok_or_else(|| QueryError::UnknownMethod(String::from_utf8_lossy(name).into_owned()))?;
        if mask & bit != 0 {
            return Err(QueryError::RepeatedMethod(method_name(bit).unwrap_or("?")));
        }
        mask |= bit;
    }
    Ok(mask)
}

/// The query templates of one configuration level: at most one default, and
/// method-specific ones whose method lists do not overlap.
#[derive(Debug, Clone)]
pub struct QuerySet<T> {
    default: Option<T>,
    by_method: Vec<(u32, T)>,
    methods: u32,
}

impl<T> Default for QuerySet<T> {
    fn default() -> Self {
        QuerySet {
            default: None,
            by_method: Vec::new(),
            methods: 0,
        }
    }
}

impl<T> QuerySet<T> {
    pub fn is_empty(&self) -> bool {
        self.default.is_none() && self.by_method.is_empty()
    }

    /// Adds a template; `methods == 0` makes it the default.
    pub fn add(&mut self, methods: u32, template: T) -> Result<(), QueryError> {
        if methods == 0 {
            if self.default.is_some() {
                return Err(QueryError::DuplicateDefault);
            }
            self.default = Some(template);
            return Ok(());
        }
        let clash = self.methods & methods;
        if clash != 0 {
            let bit = 1 << clash.trailing_zeros();
            return Err(QueryError::DuplicateMethod(method_name(bit).unwrap_or("?")));
        }
        self.methods |= methods;
        self.by_method.push((methods, template));
        Ok(())
    }

    /// The template for a request method: the one that lists it, else the default.
    pub fn select(&self, method: u32) -> Option<&T> {
        if self.methods & method != 0 {
            if let Some((_, t)) = self.by_method.iter().find(|(m, _)| m & method != 0) {
                return Some(t);
            }
        }
        self.default.as_ref()
    }

    /// Every template, default first.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.default.iter().chain(self.by_method.iter().map(|(_, t)| t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mask(names: &[&str]) -> Result<u32, QueryError> {
        parse_methods(names.iter().map(|n| n.as_bytes()))
    }

    #[test]
    fn every_method_parses_and_round_trips() {
        for &(name, bit) in METHODS {
            assert_eq!(mask(&[name]), Ok(bit));
            assert_eq!(method_name(bit), Some(name));
        }
        assert_eq!(mask(&["LOCK", "GET", "UNLOCK"]), Ok(0x1000 | 0x2 | 0x2000));
    }

    #[test]
    fn bad_method_lists() {
        assert_eq!(mask(&["get", "Post"]), Ok(0x2 | 0x8));
        assert_eq!(mask(&["GET", "get"]), Err(QueryError::RepeatedMethod("GET")));
        assert_eq!(mask(&["FETCH"]), Err(QueryError::UnknownMethod("FETCH".into())));
        assert_eq!(mask(&["GET", "GET"]), Err(QueryError::RepeatedMethod("GET")));
    }

    #[test]
    fn method_template_wins_over_default_declared_first() {
        let mut q = QuerySet::default();
        q.add(0, "default").unwrap();
        q.add(mask(&["LOCK", "GET", "UNLOCK"]).unwrap(), "method").unwrap();
        assert_eq!(q.select(0x2), Some(&"method"));
        assert_eq!(q.select(0x1000), Some(&"method"));
        assert_eq!(q.select(0x8), Some(&"default"));
        assert_eq!(q.iter().count(), 2);
    }

    #[test]
    fn no_match_and_no_default_is_none() {
        let mut q = QuerySet::default();
        q.add(mask(&["PATCH"]).unwrap(), "patch").unwrap();
        assert_eq!(q.select(0x4000), Some(&"patch"));
        assert_eq!(q.select(0x4), None);
        assert!(!q.is_empty());
        assert!(QuerySet::<()>::default().is_empty());
    }

    #[test]
    fn duplicates_are_errors() {
        let mut q = QuerySet::default();
        q.add(0, 1).unwrap();
        assert_eq!(q.add(0, 2), Err(QueryError::DuplicateDefault));
        q.add(mask(&["GET", "POST"]).unwrap(), 3).unwrap();
        assert_eq!(
            q.add(mask(&["PUT", "POST"]).unwrap(), 4),
            Err(QueryError::DuplicateMethod("POST"))
        );
        assert_eq!(
            QueryError::DuplicateMethod("POST").to_string(),
            "is duplicate: a query for method \"POST\" is already set"
        );
    }
}
