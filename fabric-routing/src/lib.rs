//! Routing shared by the node agent and the gateway operator, over rtnetlink: the fabric's
//! own routes (marked with their protocol number) and the VXLAN overlay between nodes and the
//! gateway, for clusters where nodes cannot reach the gateway's address directly.
pub mod overlay;
pub mod routes;
