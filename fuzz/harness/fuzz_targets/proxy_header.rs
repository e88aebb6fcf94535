//! The `proxy_header` fuzz target: its body is `maitred_fuzz::proxy_header` (fuzz/src), which
//! `cargo test` also runs on the saved corpus (docs/FUZZING.md).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| maitred_fuzz::proxy_header(data));
