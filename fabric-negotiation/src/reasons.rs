//! The reasons of the conditions the negotiation writes, typed: what decides a condition and
//! what reads one back (this crate, fabricctl) share one spelling of each.
fabric_kube::reasons! {
    /// A ForeignCluster's NetworkReady (both sides).
    pub enum Network {
        /// The gateway reports no tunnel to the peer yet.
        NoTunnel = "NoTunnel",
        Connected = "Connected",
        Connecting = "Connecting",
        TunnelError = "TunnelError",
        /// The consumer holds no Identity on the provider yet.
        NoIdentity = "NoIdentity",
        /// This cluster's gateway has not published its key and endpoint yet.
        WaitingForGateway = "WaitingForGateway",
        WaitingForProvider = "WaitingForProvider",
        /// The provider's answer cannot be used (see the message).
        UnusableAnswer = "UnusableAnswer",
        /// The peer removed its side of the network.
        Unpeered = "Unpeered",
    } else {
        /// The provider's own reason for not answering yet (its PeeringNetwork's Ready), as it
        /// wrote it.
        Provider(String),
    }
}

fabric_kube::reasons! {
    /// A PeeringNetwork's Ready: the provider's answer to the consumer.
    pub enum Answer {
        Answered = "Answered",
        /// The consumer spoke for someone else (see the message).
        Refused = "Refused",
        WaitingForGateway = "WaitingForGateway",
    }
}

fabric_kube::reasons! {
    /// A ForeignCluster's ResourcesGranted: the best answer of the peer's slices.
    pub enum ResourcesGranted {
        Granted = "Granted",
        PartiallyGranted = "PartiallyGranted",
        Refused = "Refused",
        /// The provider has not answered yet.
        Pending = "Pending",
        /// No resources asked for.
        NoSlice = "NoSlice",
    } else {
        /// A slice's answer this version does not know, as the provider wrote it.
        Provider(String),
    }
}

fabric_kube::reasons! {
    /// A ForeignCluster's Tethered (both sides of a consumer–provider peering).
    pub enum Mode {
        /// The provider is tethered to the consumer (docs/modes.md).
        Tethered = "Tethered",
        Autonomous = "Autonomous",
    }
}
