//! Fuzz checks of gateway-core's parsers of untrusted bytes.
//!
//! Each function of [`checks`] takes arbitrary bytes, runs one parser or
//! encoder of gateway-core on them (or on values built from them) and
//! asserts what must hold of its answer: it panics when something is wrong.
//! The libFuzzer binaries in `fuzz_targets/` and the stable test in
//! `tests/stable.rs` both call them.

pub mod checks;
pub mod source;
