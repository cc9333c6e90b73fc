//! The checked-in CRD YAML must be what the Rust types generate: change the types, then run
//! `cargo xtask codegen`.
use std::path::Path;

use kube::CustomResourceExt;

#[test]
fn checked_in_crds_are_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    let files = fabric_api::crd_files();
    for (name, yaml) in &files {
        let path = dir.join(name);
        let on_disk = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; run `cargo xtask codegen`", path.display()));
        assert!(
            &on_disk == yaml,
            "{} is stale; run `cargo xtask codegen`",
            path.display()
        );
    }
    // and nothing else lingers there
    let mut listed: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    listed.sort();
    let mut want: Vec<_> = files.iter().map(|(n, _)| n.clone()).collect();
    want.sort();
    assert_eq!(listed, want, "deploy/crds has files no type generates");
}

#[test]
fn crds_have_schemas_validation_and_columns() {
    for crd in fabric_api::crds() {
        let v = &crd.spec.versions[0];
        assert!(v.served && v.storage);
        let schema = serde_json::to_string(&v.schema).unwrap();
        assert!(
            schema.contains("openAPIV3Schema"),
            "{}",
            crd.spec.names.kind
        );
        assert!(
            v.additional_printer_columns
                .as_ref()
                .is_some_and(|c| c.len() >= 2),
            "{} needs printer columns",
            crd.spec.names.kind
        );
    }
    let conf =
        serde_json::to_string(&fabric_api::networking::v1alpha1::Configuration::crd()).unwrap();
    assert!(
        conf.contains("isCIDR(self)"),
        "CIDRs are validated by the API server"
    );
}

#[test]
fn every_group_version_owns_its_crds() {
    let mut names = Vec::new();
    for g in fabric_api::GROUPS {
        let crds = (g.crds)();
        assert!(!crds.is_empty(), "{}/{} defines no CRD", g.group, g.version);
        for crd in crds {
            // The #[kube(group, version)] literals must match the module's constants.
            assert_eq!(crd.spec.group, g.group, "{}", crd.spec.names.kind);
            let versions: Vec<_> = crd.spec.versions.iter().map(|v| v.name.as_str()).collect();
            assert_eq!(versions, [g.version], "{}", crd.spec.names.kind);
            names.push(crd.metadata.name.unwrap());
        }
    }
    let n = names.len();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), n, "a CRD is listed twice");
    assert_eq!(fabric_api::crds().len(), n);
}
