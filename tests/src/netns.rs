//! The namespace test bed, shared with the crates' own namespace tests: see
//! [`fabric_netns::testbed`].
pub use fabric_netns::testbed::*;
