//! Compiles `fabric-ebpf` for the bpf target (nightly + bpf-linker) and leaves the object in
//! OUT_DIR, so every binary that links this crate carries its own programs.
use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let cargo_metadata::Metadata { packages, .. } = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = packages
        .into_iter()
        .find(|p| p.name.as_str() == "fabric-ebpf")
        .ok_or_else(|| anyhow!("fabric-ebpf package not found"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("fabric-ebpf manifest has no parent"))?
        .as_str()
        .to_owned();
    // fabric-common is compiled into the programs too; aya-build only watches the package dir.
    println!("cargo:rerun-if-changed={root_dir}/../fabric-common/src");
    aya_build::build_ebpf(
        [Package {
            name: "fabric-ebpf",
            root_dir: &root_dir,
            ..Default::default()
        }],
        Toolchain::default(),
    )
}
