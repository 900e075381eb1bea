//! librdkafka settings shared by the client library and the tracker, and the producer they
//! both use ([`producer::QuietProducer`]).

pub(crate) mod producer;

/// Settings of every producer that writes markers or copies: idempotent, acknowledged by all
/// in-sync replicas, retried by librdkafka without reordering. A marker or copy that this
/// producer reports as delivered is durable; that is what the protocol's invariants rest on.
pub(crate) const DURABLE_PRODUCER: [(&str, &str); 5] = [
    ("enable.idempotence", "true"),
    // A record produced with no partition (a schedule's) goes where the Java client's default
    // partitioner puts the same key, not where librdkafka's own default would.
    ("partitioner", "murmur2_random"),
    ("acks", "all"),
    // Batch what arrives together, but never hold a lone marker back for long.
    ("linger.ms", "2"),
    ("compression.type", "none"),
];

/// Settings of the client's producer for Start markers: [`DURABLE_PRODUCER`] without the
/// linger. A batch is handed to the application only once its Starts are durable, so any time
/// a Start waits in librdkafka's queue is added to every record's handout; the poll thread
/// already writes a batch's Starts together. Settlements keep the linger: nobody waits for
/// them but the application's `ack()`, and their coalescing window wants company.
pub(crate) fn start_producer() -> Vec<(&'static str, &'static str)> {
    let mut settings = DURABLE_PRODUCER.to_vec();
    for (key, value) in &mut settings {
        if *key == "linger.ms" {
            *value = "0";
        }
    }
    settings
}

/// Fetch pacing for consumers that read a backlog as fast as they can (the client's source
/// consumer, the tracker's markers consumer). librdkafka stops fetching a partition once its
/// local queue holds `queued.min.messages` (or `queued.max.messages.kbytes`) and then waits
/// `fetch.queue.backoff.ms`, 1000 ms by default, before it looks again: a consumer that drains
/// its queue in a few milliseconds then idles for the rest of the second. Measured on the
/// benchmark suite (BENCHMARKS.md, 2026-12-01): a plain consumer went from 190–340 k to over
/// 1.5 M records/s, the client library from 130 k to 400–570 k. The queue bounds, and so the
/// memory, stay as they are; a user's own setting still wins.
pub(crate) const FETCH_PACING: (&str, &str) = ("fetch.queue.backoff.ms", "10");

/// `wait` rounded up to whole milliseconds, for a librdkafka poll. librdkafka counts a poll's
/// timeout in milliseconds, and rust-rdkafka truncates a `Duration` to them: the rest below a
/// millisecond is polled with a timeout of 0, which returns at once, and rdkafka's poll loop
/// polls again until the `Duration` has passed. Every wait with a fraction of a millisecond
/// in it so ended in a spin on the clock. The tracker's markers loop, which waits until the
/// next deadline, spent 25–40 % of a core that way at 1,000 redeliveries a second
/// (BENCHMARKS.md, "A spin in the markers loop"). Rounded up, the poll sleeps in librdkafka
/// and wakes at most a millisecond later than asked.
pub(crate) fn whole_ms(wait: std::time::Duration) -> std::time::Duration {
    let ms = wait.as_nanos().div_ceil(1_000_000);
    std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

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

/// A client context that remembers the first authentication or TLS failure librdkafka
/// reports. librdkafka retries those forever like any connection error, but a wrong password
/// or an untrusted certificate will not fix itself, so a command that sees one stops at once
/// with the reason instead of waiting for a timeout.
#[derive(Debug, Default)]
pub struct AuthWatch {
    failure: std::sync::Mutex<Option<String>>,
    /// librdkafka reports every failed connection attempt, about 40 a second while the broker
    /// refuses connections: one line per 10 s says so, with the number held back.
    limit: crate::log_limit::LogLimit,
}

impl AuthWatch {
    /// The first authentication or TLS failure seen, if any.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().ok().and_then(|f| f.clone())
    }
}

impl rdkafka::producer::ProducerContext for AuthWatch {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

/// True for librdkafka errors that mean the credentials or certificates are wrong.
pub fn is_auth_failure(error: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        error.rdkafka_error_code(),
        Some(C::Authentication | C::SaslAuthenticationFailed | C::SSL)
    )
}

impl rdkafka::ClientContext for AuthWatch {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        if is_auth_failure(&error) {
            tracing::error!(%error, reason, "authentication with Kafka failed");
            if let Ok(mut f) = self.failure.lock() {
                f.get_or_insert_with(|| reason.to_string());
            }
        } else if let Some(held_back) = self
            .limit
            .allow("kafka client error", std::time::Instant::now())
        {
            tracing::warn!(%error, reason, held_back, "kafka client error");
        }
    }
}

/// True for librdkafka settings whose value is a secret (passwords, private keys, OAuth
/// client secrets): those are never printed.
pub fn is_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key.contains("password")
        || key.contains("secret")
        || key.ends_with(".key")
        || key.ends_with("key.pem")
        || key == "sasl.oauthbearer.config"
        || key == "sasl.jaas.config"
}

/// Formats librdkafka settings for `Debug` with secret values replaced by `***`.
pub struct Redacted<'a>(pub &'a [(String, String)]);

impl std::fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(k, v)| {
                let shown = if is_secret(k) { "***" } else { v.as_str() };
                (k.as_str(), shown)
            }))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_round_up_to_whole_milliseconds() {
        use std::time::Duration;
        let ms = |w: Duration| whole_ms(w).as_millis();
        assert_eq!(
            ms(Duration::ZERO),
            0,
            "a poll that must not wait still does not"
        );
        assert_eq!(ms(Duration::from_micros(1)), 1);
        assert_eq!(ms(Duration::from_micros(999)), 1);
        assert_eq!(ms(Duration::from_millis(1)), 1);
        assert_eq!(ms(Duration::from_micros(3_400)), 4);
        assert_eq!(whole_ms(Duration::MAX).as_millis(), u128::from(u64::MAX));
    }

    #[test]
    fn secret_values_are_never_formatted() {
        let settings = vec![
            ("sasl.password".to_string(), "hunter2".to_string()),
            ("ssl.key.password".to_string(), "k3y".to_string()),
            ("ssl.key.pem".to_string(), "-----BEGIN".to_string()),
            ("sasl.username".to_string(), "tracker".to_string()),
        ];
        let shown = format!("{:?}", Redacted(&settings));
        assert!(!shown.contains("hunter2") && !shown.contains("k3y") && !shown.contains("BEGIN"));
        assert!(shown.contains("tracker") && shown.contains("sasl.password"));
    }
}
