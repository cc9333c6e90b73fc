//! Offloaded pods (issue 11, provider side): the ShadowPod a consumer's pod becomes
//! ([`forge`], called by the consumer's virtual kubelet).
pub mod forge;
