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

/// A librdkafka config: the brokers, then the settings the caller needs, then the user's own
/// overrides last, so an operator can change anything this crate sets.
pub(crate) fn client_config(
    brokers: &str,
    own: &[(&str, &str)],
    overrides: &[(String, String)],
) -> rdkafka::ClientConfig {
    let mut c = rdkafka::ClientConfig::new();
    c.set("bootstrap.servers", brokers);
    for (k, v) in own {
        c.set(*k, *v);
    }
    for (k, v) in overrides {
        c.set(k, v);
    }
    c
}
