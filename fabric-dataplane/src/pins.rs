//! The verified programs pinned beside the maps, so that a restarted process adopts them
//! instead of loading the object again (issue 22 §3). Loading parses the object and runs the
//! kernel's verifier on both programs: about 70 ms of kernel time on an idle machine and over
//! a second on a loaded one, and a restarted gateway delivers nothing until its new devices
//! have the programs. Adopted, the same programs go on the new devices at once.
//!
//! A pin names the build it comes from ([`build_tag`]): a new build never adopts an older
//! build's programs, and removes them when it pins its own ([`stale`]). A pin is adopted only
//! if the maps its programs read are the maps pinned beside it.
use std::{
    collections::BTreeSet,
    os::fd::AsFd,
    path::{Path, PathBuf},
    sync::OnceLock,
};

use aya::{maps::MapInfo, programs::SchedClassifier};
use fabric_common::{maps as names, progs};

use crate::{Maps, loader::EBPF_OBJECT, sys};

/// The programs pinned: each one's name starts its pin's name.
pub(crate) const PROGRAMS: [&str; 2] = [progs::EGRESS, progs::INGRESS];

/// A 64-bit FNV-1a of `bytes`: stable across toolchains, unlike `DefaultHasher`.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// What tells this build's programs from another's: a hash of the embedded object.
pub(crate) fn build_tag() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| format!("{:016x}", fnv1a(EBPF_OBJECT)))
}

/// The pin of program `prog` of build `tag`.
pub(crate) fn pin_name(prog: &str, tag: &str) -> String {
    format!("{prog}-{tag}")
}

pub(crate) fn pin_path(dir: &Path, prog: &str) -> PathBuf {
    dir.join(pin_name(prog, build_tag()))
}

/// Of the file names in a pin directory, the program pins of builds other than `tag`.
pub(crate) fn stale<'a>(files: impl IntoIterator<Item = &'a str>, tag: &str) -> Vec<&'a str> {
    files
        .into_iter()
        .filter(|f| {
            PROGRAMS.iter().any(|p| {
                f.strip_prefix(p)
                    .and_then(|rest| rest.strip_prefix('-'))
                    .is_some_and(|t| t != tag)
            })
        })
        .collect()
}

/// Of the file names in a pin directory, every program pin (any build).
pub(crate) fn programs<'a>(files: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    stale(files, "")
}

/// Whether programs reading the maps of ids `read` may be adopted beside the maps pinned
/// with ids `pinned`: they read only those. A pinned map replaced since (another build's
/// layout, a pin removed and made again) is not the one they read. Programs with maps of their
/// own (constants) would never be adopted: loading them again is the safe side (the
/// integration test `pins` fails then).
pub(crate) fn reads_the_pinned(read: &BTreeSet<u32>, pinned: &BTreeSet<u32>) -> bool {
    !read.is_empty() && read.is_subset(pinned)
}

/// This build's programs and the maps pinned in `dir`, when an earlier run pinned them there
/// and they still fit together; otherwise why not (the object is loaded then).
pub(crate) fn adopt(dir: &Path) -> Result<(SchedClassifier, SchedClassifier, Maps), String> {
    let mut found = Vec::with_capacity(PROGRAMS.len());
    for prog in PROGRAMS {
        let path = pin_path(dir, prog);
        found.push(
            SchedClassifier::from_pin(&path).map_err(|e| format!("{}: {e}", path.display()))?,
        );
    }
    let mut pinned = BTreeSet::new();
    for name in names::ALL {
        let info = MapInfo::from_pin(dir.join(name)).map_err(|e| format!("map {name}: {e}"))?;
        pinned.insert(info.id());
    }
    let mut read = BTreeSet::new();
    for p in &found {
        let fd = p.fd().map_err(|e| e.to_string())?;
        let ids = sys::prog_map_ids(fd.as_fd())
            .map_err(|e| format!("the maps a pinned program reads: {e}"))?;
        read.extend(ids);
    }
    if !reads_the_pinned(&read, &pinned) {
        return Err(format!(
            "the pinned programs read maps {read:?}, not those pinned beside them {pinned:?}"
        ));
    }
    let maps = Maps::open_pinned(dir).map_err(|e| e.to_string())?;
    let ingress = found.pop().ok_or("no ingress program")?;
    let egress = found.pop().ok_or("no egress program")?;
    Ok((egress, ingress, maps))
}

/// The names of the files in `dir` (none when it cannot be read).
fn files_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect()
}

/// The program pins in `dir` of builds other than this one, which this run replaces.
pub(crate) fn stale_in(dir: &Path) -> Vec<PathBuf> {
    let files = files_in(dir);
    stale(files.iter().map(String::as_str), build_tag())
        .into_iter()
        .map(|f| dir.join(f))
        .collect()
}

/// Every program pin in `dir`, whatever its build.
pub(crate) fn all_in(dir: &Path) -> Vec<PathBuf> {
    let files = files_in(dir);
    programs(files.iter().map(String::as_str))
        .into_iter()
        .map(|f| dir.join(f))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tag_is_the_objects_and_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(build_tag().len(), 16);
        assert_eq!(build_tag(), format!("{:016x}", fnv1a(EBPF_OBJECT)));
    }

    #[test]
    fn only_other_builds_program_pins_are_stale() {
        let files = [
            "FABRIC_PEERS",
            "fabric_egress-aaaa",
            "fabric_ingress-aaaa",
            "fabric_egress-bbbb",
            "fabric_ingress-bbbb",
            "fabric_egress",
            "fabric_egressive-cccc",
            "notes",
        ];
        assert_eq!(
            stale(files, "aaaa"),
            ["fabric_egress-bbbb", "fabric_ingress-bbbb"]
        );
        assert_eq!(
            programs(files),
            [
                "fabric_egress-aaaa",
                "fabric_ingress-aaaa",
                "fabric_egress-bbbb",
                "fabric_ingress-bbbb"
            ]
        );
        assert_eq!(pin_name(progs::EGRESS, "aaaa"), "fabric_egress-aaaa");
    }

    #[test]
    fn programs_are_adopted_only_beside_the_maps_they_read() {
        let set = |ids: &[u32]| ids.iter().copied().collect::<BTreeSet<u32>>();
        // A pinned map neither reads (the agent's alone): fine.
        assert!(reads_the_pinned(&set(&[1, 2]), &set(&[1, 2, 3])));
        // A pinned map replaced since: they read the old one.
        assert!(!reads_the_pinned(&set(&[1, 7]), &set(&[1, 2, 3])));
        assert!(!reads_the_pinned(&set(&[]), &set(&[1, 2, 3])));
    }
}
