//! CEL rules the CRDs share. Each passes values the type rule above it refuses, so that a bad
//! value gets one message, not a CEL error.
pub(crate) const IPV4_CIDR: &str = "isCIDR(self) && cidr(self).ip().family() == 4";
/// What a peer may announce as its pod or external CIDR. A prefix shorter than /8 would have
/// every node route most of the address space into the tunnel; loopback, link-local (metadata
/// services), multicast and 0.0.0.0/8 are never pods. The fields carry a maxLength
/// ("255.255.255.255/32") so the API server can bound the cost.
pub(crate) const NO_HOST_BITS: &str = "!isCIDR(self) || cidr(self).masked() == cidr(self)";
pub(crate) const AT_MOST_SLASH_8: &str = "!isCIDR(self) || cidr(self).prefixLength() >= 8";
pub(crate) const UNICAST: &str = "!isCIDR(self) || cidr(self).ip().isGlobalUnicast()";
pub(crate) const IPV4_ADDR: &str = "isIP(self) && ip(self).family() == 4";
/// A list of IP addresses (either family). The list and its items carry maxItems/maxLength.
pub(crate) const IP_ADDRS: &str = "self.all(a, isIP(a))";
pub(crate) const DNS_LABEL: &str =
    "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && size(self) <= 63";
/// A WireGuard key: 32 bytes in base64 (the last character before '=' carries 4 bits).
pub(crate) const WG_KEY: &str = "self.matches('^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=$')";
pub(crate) const IMMUTABLE: &str = "self == oldSelf";
pub(crate) const HTTPS_URL: &str = "isURL(self) && url(self).getScheme() == 'https'";

/// An object the API server keeps as it comes (no field-by-field schema): for embedded
/// Kubernetes types that the API server validates where they are used.
pub(crate) fn preserve_unknown_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// A list of such objects.
pub(crate) fn preserve_unknown_array(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": true,
        },
    })
}
