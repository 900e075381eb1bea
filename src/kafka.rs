//! librdkafka settings shared by the client library and the tracker.

/// Settings of every producer that writes markers or copies: idempotent, acknowledged by all
/// in-sync replicas, retried by librdkafka without reordering. A marker or copy that this
/// producer reports as delivered is durable; that is what the protocol's invariants rest on.
pub(crate) const DURABLE_PRODUCER: [(&str, &str); 4] = [
    ("enable.idempotence", "true"),
    ("acks", "all"),
    // Batch what arrives together, but never hold a lone marker back for long.
    ("linger.ms", "2"),
    ("compression.type", "none"),
];
