//! Replays the saved corpus of every fuzz target (fuzz/corpus/<target>/, docs/FUZZING.md)
//! through the target's body, as `cargo test` runs it: no cargo-fuzz, no nightly compiler.
//! A file that makes a target panic fails the test, with its path.

use std::fs;
use std::panic;
use std::path::Path;

#[test]
fn every_saved_input_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut failures = Vec::new();
    for (name, target) in maitred_fuzz::TARGETS {
        let dir = root.join(name);
        let mut files: Vec<_> = fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.expect("a directory entry").path())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "{}: no saved inputs", dir.display());
        for path in &files {
            let data = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            if panic::catch_unwind(|| target(&data)).is_err() {
                failures.push(path.display().to_string());
            }
        }
        eprintln!("{name}: {} saved inputs replayed", files.len());
    }
    assert!(failures.is_empty(), "inputs that fail their target:\n{}", failures.join("\n"));
}
