//! The fuzz targets' checks (`fuzz/src`) over their committed seeds (`fuzz/seeds/TARGET/`):
//! the seeds are meaningful inputs (real packets, a real `wg set`, a real configuration), so
//! this exercises each invariant on stable without libFuzzer. `cargo xtask fuzz TARGET`
//! explores from these seeds.

use std::path::Path;

#[test]
fn every_target_passes_its_seeds() {
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds");
    let mut failed = Vec::new();
    for (name, check) in fabric_fuzz::TARGETS {
        let dir = seeds.join(name);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("reading the seeds").path())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "{name}: no seeds in {}", dir.display());
        for f in files {
            let data = std::fs::read(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            if std::panic::catch_unwind(|| check(&data)).is_err() {
                failed.push(f);
            }
        }
    }
    assert!(
        failed.is_empty(),
        "seeds failing their target's check: {failed:#?}"
    );
}

/// A target added to `fuzz_targets/` (what `cargo xtask fuzz --list` shows) is registered in
/// `TARGETS`, so it has seeds and they are replayed here.
#[test]
fn every_target_binary_is_registered() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/fuzz_targets");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            Some(name.strip_suffix(".rs")?.to_owned())
        })
        .collect();
    files.sort();
    let mut registered: Vec<String> = fabric_fuzz::TARGETS
        .iter()
        .map(|(n, _)| n.to_string())
        .collect();
    registered.sort();
    assert_eq!(files, registered);
}
