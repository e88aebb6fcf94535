//! The `shared_region` fuzz target: its body is `maitred_fuzz::shared_region` (fuzz/src), which
//! `cargo test` also runs on the saved corpus (docs/FUZZING.md).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| maitred_fuzz::shared_region(data));
