//! libFuzzer entry point; the check itself is gateway_core_fuzz::checks::jwt_token.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway_core_fuzz::checks::jwt_token(data));
