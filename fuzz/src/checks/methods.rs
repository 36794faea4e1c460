//! `method::parse_methods` on arbitrary names, and `QuerySet`'s choice.
//!
//! What must hold: a method list parses to the union of its methods' bits
//! exactly when every name is one nginx knows, in any letter case (as the
//! C module takes them), and none is repeated (else the first fault is the error); templates added to a
//! `QuerySet` are refused when a default or a method is given twice, and a
//! request method gets the first template that lists it, else the default.

use crate::source::Source;
use gateway_core::method::{method_bit, method_name, parse_methods, QueryError, QuerySet, METHODS};

pub fn methods(data: &[u8]) {
    let mut src = Source::new(data);
    let mut names: Vec<Vec<u8>> = Vec::new();
    for _ in 0..src.below(5) {
        let name = match src.below(4) {
            0 => src.bytes(8).to_vec(),
            1 => src.pick(METHODS).0.to_ascii_lowercase().into_bytes(),
            _ => src.pick(METHODS).0.as_bytes().to_vec(),
        };
        names.push(name);
    }
    let mut want = Ok(0u32);
    for name in &names {
        let Some(&(n, bit)) = METHODS.iter().find(|(n, _)| n.as_bytes().eq_ignore_ascii_case(name)) else {
            want = Err(QueryError::UnknownMethod(String::from_utf8_lossy(name).into_owned()));
            break;
        };
        assert_eq!(method_bit(name), Some(bit));
        assert_eq!(method_name(bit), Some(n));
        let mask = want.clone().unwrap();
        if mask & bit != 0 {
            want = Err(QueryError::RepeatedMethod(n));
            break;
        }
        want = Ok(mask | bit);
    }
    assert_eq!(parse_methods(names.iter().map(|n| n.as_slice())), want);

    // Templates: (mask, id) added in turn.
    let mut set = QuerySet::default();
    let mut default = None;
    let mut listed: Vec<(u32, usize)> = Vec::new();
    for id in 0..src.below(6) {
        let mask = if src.below(3) == 0 {
            0
        } else {
            let mut m = 0;
            for _ in 0..1 + src.below(3) {
                m |= src.pick(METHODS).1;
            }
            m
        };
        let taken = listed.iter().fold(0, |a, (m, _)| a | m);
        let want = if mask == 0 {
            if default.is_some() {
                Err(QueryError::DuplicateDefault)
            } else {
                default = Some(id);
                Ok(())
            }
        } else if taken & mask != 0 {
            let first = METHODS
                .iter()
                .map(|m| m.1)
                .filter(|b| taken & mask & b != 0)
                .min()
                .unwrap();
            Err(QueryError::DuplicateMethod(method_name(first).unwrap()))
        } else {
            listed.push((mask, id));
            Ok(())
        };
        assert_eq!(set.add(mask, id), want);
    }
    assert_eq!(set.is_empty(), default.is_none() && listed.is_empty());
    let expected = default.iter().copied().chain(listed.iter().map(|l| l.1));
    assert!(set.iter().copied().eq(expected));
    for method in METHODS.iter().map(|m| m.1).chain([0, 1, src.u32()]) {
        let want = listed.iter().find(|(m, _)| m & method != 0).map(|l| l.1).or(default);
        assert_eq!(set.select(method).copied(), want, "method {method:#x}");
    }
}
