//! Offloading in the sharing layer (consumer → provider peering), see
//! `shared/design/sharing-layer.md`: what runs a consumer's pods on its provider and stands for
//! the provider at home.
//!
//! - [`shadowpod`] (provider): the ShadowPod a consumer's pod becomes (its forge, called by the
//!   consumer's virtual kubelet), the controller that runs its real pod (decide, resize), what
//!   the admission webhook admits and charges (admission, quota, the webhook on
//!   `fabric_http::https`), and the opt-in at-most-once stop of a silent consumer's pods
//!   (partition, fence);
//! - [`endpointslices`], [`networkpolicies`] (provider): a consumer's shadows of its offloaded
//!   namespaces' EndpointSlices and NetworkPolicies written as real ones, addresses remapped
//!   and whatever is not the consumer's refused;
//! - [`pod_placement`] (consumer): where the pods of an offloaded namespace may run, the pure
//!   mutation of the pod webhook (served by the same server as the ShadowPod webhook);
//! - [`virtual_node`] (consumer): for each VirtualNode, its virtual kubelet and the RBAC it
//!   needs, its status, and its drain when it goes.
//!
//! It depends on neither authentication nor negotiation: a tenant namespace is
//! `fabric_api::names::namespace::tenant`, the agreed at-most-once terms and quantities are
//! `fabric_api`'s, and whether an unpeer was forced is an annotation read by
//! `fabric_api::names`. Negotiation creates the VirtualNodes this drives; the virtual kubelet
//! uses the forge, resize and the virtual node's objects.
pub mod endpointslices;
pub mod networkpolicies;
pub mod pod_placement;
pub mod shadowpod;
pub mod storage;
pub mod tethered;
pub mod virtual_node;
