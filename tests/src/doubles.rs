//! The Kubernetes test doubles of `fabric-test-doubles`, each with the function that starts its
//! binary against an [`ApiServer`](crate::apiserver::ApiServer) (the doubles know nothing of
//! the fixture).
/// The EndpointSlice controller's decisions, and starting it ([`endpoints::start`]).
pub mod endpoints {
    use std::path::Path;

    use anyhow::Result;
    pub use fabric_test_doubles::endpoints::*;

    use crate::{ChildGuard, apiserver::ApiServer, process::Bin};

    /// `fabric-test-endpoints` against `api` as its admin (the stand-in is the cluster's, as the
    /// test scheduler), its log at `log`; it stops when the guard drops.
    pub fn start(api: &ApiServer, log: &Path) -> Result<ChildGuard> {
        Bin::new("fabric-test-endpoints")?
            .kubeconfig(&api.kubeconfig)
            .log(log)
            .spawn()
    }
}
/// The storage stand-ins' decisions, and starting them ([`storage::start`]).
pub mod storage {
    use std::path::Path;

    use anyhow::Result;
    pub use fabric_test_doubles::storage::*;

    use crate::{ChildGuard, apiserver::ApiServer, process::Bin};

    /// `fabric-test-storage --default-class` against `api` as its admin (the stand-in is the
    /// cluster's, as the test scheduler), its PV directories under `root`, its log at `log`; it
    /// stops when the guard drops.
    pub fn start(api: &ApiServer, root: &Path, log: &Path) -> Result<ChildGuard> {
        Bin::new("fabric-test-storage")?
            .kubeconfig(&api.kubeconfig)
            .arg("--root")
            .arg(root)
            .arg("--default-class")
            .log(log)
            .spawn()
    }
}
/// The test scheduler's decisions, and starting it ([`sched::start`]).
pub mod sched {
    pub use fabric_test_doubles::sched::*;

    /// `fabric-test-scheduler` against `api` as its admin (the scheduler is the cluster's),
    /// its log at `log`; it stops when the guard drops.
    pub fn start(
        api: &crate::apiserver::ApiServer,
        log: &std::path::Path,
    ) -> anyhow::Result<crate::ChildGuard> {
        crate::process::Bin::new("fabric-test-scheduler")?
            .kubeconfig(&api.kubeconfig)
            .log(log)
            .spawn()
    }
}
