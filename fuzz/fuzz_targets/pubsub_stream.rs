//! libFuzzer entry point; the check itself is gateway_core_fuzz::checks::pubsub_stream.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway_core_fuzz::checks::pubsub_stream(data));
