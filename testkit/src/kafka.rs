//! Topics for a test or a benchmark run: created and visible before they are used, deleted
//! after.

use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

/// A librdkafka config that reaches `brokers` and nothing more.
pub fn client(brokers: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers);
    c
}

/// Creates topic `name` with `partitions` partitions and `config`, then waits until its
/// metadata shows every partition (a producer or consumer that looks earlier may not find it).
/// The replication factor is the broker's default: 1 on a single broker, 3 on the cluster
/// `KAFKA_BROKERS=3 scripts/kafka start` runs.
pub async fn create_topic(
    client: &ClientConfig,
    name: &str,
    partitions: i32,
    config: &[(&str, &str)],
) -> Result<(), crate::Error> {
    let admin: AdminClient<DefaultClientContext> = client.create()?;
    let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(-1));
    for (k, v) in config {
        topic = topic.set(k, v);
    }
    for r in admin.create_topics(&[topic], &AdminOptions::new()).await? {
        r.map_err(|(t, e)| format!("creating {t}: {e}"))?;
    }
    let probe: BaseConsumer = client.create()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(md) = probe.fetch_metadata(Some(name), Duration::from_secs(5)) {
            let visible = md.topics().iter().any(|t| {
                t.name() == name
                    && t.error().is_none()
                    && t.partitions().len() == usize::try_from(partitions).unwrap_or(0)
            });
            if visible {
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            return Err(format!("topic {name} never appeared in the metadata").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Deletes `names`; an error names the first topic that could not be deleted.
pub async fn delete_topics(client: &ClientConfig, names: &[&str]) -> Result<(), crate::Error> {
    let admin: AdminClient<DefaultClientContext> = client.create()?;
    for r in admin.delete_topics(names, &AdminOptions::new()).await? {
        r.map_err(|(t, e)| format!("deleting {t}: {e}"))?;
    }
    Ok(())
}
