//! A restart of the same build adopts the verified programs pinned beside the maps instead
//! of loading the object again (issue 22 §3: a restarted gateway delivers nothing until its
//! devices have the programs); programs whose maps were replaced since are not adopted; a
//! reset removes the program pins with the maps.
use std::path::{Path, PathBuf};

use fabric_common::maps as names;
use fabric_dataplane::Dataplane;

fn ids(dp: &Dataplane) -> (u32, u32) {
    let id = |egress| dp.program(egress).info().expect("program info").id();
    (id(true), id(false))
}

/// A pin directory of this test's own, removed on drop.
struct Pins(PathBuf);

impl Drop for Pins {
    fn drop(&mut self) {
        let _ = Dataplane::reset(&self.0);
    }
}

fn program_pins(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|f| f.starts_with("fabric_"))
        .collect();
    v.sort();
    v
}

#[test]
fn a_restart_adopts_the_pinned_programs() {
    if !fabric_netns::testbed::is_root() {
        assert!(
            std::env::var_os("CI").is_none(),
            "pin tests need root in CI"
        );
        eprintln!("skipped: pinning programs needs root");
        return;
    }
    let pins = Pins(PathBuf::from(format!(
        "/sys/fs/bpf/fabric-test-pins-{}",
        std::process::id()
    )));
    let dir = pins.0.as_path();
    let first = ids(&Dataplane::load(Some(dir)).expect("first load"));
    let pinned = program_pins(dir);
    assert_eq!(pinned.len(), 2, "{pinned:?}");
    assert!(pinned[0].starts_with("fabric_egress-"), "{pinned:?}");
    assert!(pinned[1].starts_with("fabric_ingress-"), "{pinned:?}");

    // The process gone (the first Dataplane dropped), a new one adopts the same programs.
    let again = ids(&Dataplane::load(Some(dir)).expect("second load"));
    assert_eq!(again, first, "the pinned programs were loaded again");

    // A map replaced under them: they read the old one, so the object is loaded again, and
    // its programs pinned in their place.
    std::fs::remove_file(dir.join(names::PEERS)).unwrap();
    let reloaded = ids(&Dataplane::load(Some(dir)).expect("load after a map went"));
    assert_ne!(reloaded.0, first.0, "programs adopted beside another map");
    assert_ne!(reloaded.1, first.1, "programs adopted beside another map");
    assert_eq!(program_pins(dir), pinned, "the same build's pin names");
    assert_eq!(
        ids(&Dataplane::load(Some(dir)).expect("load after the reload")),
        reloaded
    );

    // A pin of another build's programs is removed when this build pins its own.
    std::fs::rename(
        dir.join(&pinned[0]),
        dir.join("fabric_egress-0000000000000000"),
    )
    .unwrap();
    Dataplane::load(Some(dir)).expect("load beside another build's pin");
    assert_eq!(program_pins(dir), pinned);

    Dataplane::reset(dir).expect("reset");
    assert!(!dir.exists(), "reset left the pin directory");
}
