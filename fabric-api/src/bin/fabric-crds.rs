//! Writes the CRD YAML generated from the Rust types into a directory (default deploy/crds),
//! removing files there that no type generates any more. Run through `cargo xtask codegen`.
use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("deploy/crds"));
    std::fs::create_dir_all(&dir)?;
    let files = fabric_api::crd_files();
    for entry in std::fs::read_dir(&dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".yaml") && !files.iter().any(|(n, _)| *n == name) {
            std::fs::remove_file(dir.join(&name))?;
            println!("removed {name}");
        }
    }
    for (name, yaml) in files {
        let path = dir.join(&name);
        if std::fs::read_to_string(&path).ok().as_deref() != Some(yaml.as_str()) {
            std::fs::write(&path, yaml)?;
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}
