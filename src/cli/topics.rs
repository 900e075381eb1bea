//! `topics create`, and the start-up check of the markers topic's settings.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;

use crate::kafka::AuthWatch;

use super::args::{KafkaArgs, TopicsArgs};

/// Why a topic command failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopicsError {
    /// The admin client could not be created or the request failed as a whole.
    #[error("kafka admin: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// The broker refused to create a topic.
    #[error("creating topic `{topic}` failed: {code}")]
    Create {
        /// The topic.
        topic: String,
        /// The broker's error.
        code: RDKafkaErrorCode,
    },
    /// The markers topic is missing or unusable.
    #[error("{0}")]
    Markers(String),
    /// No broker answered; worth trying again.
    #[error("no Kafka broker at {brokers} answered: {error}")]
    Unreachable {
        /// The bootstrap servers tried.
        brokers: String,
        /// librdkafka's error.
        error: rdkafka::error::KafkaError,
    },
    /// The broker refused our credentials or certificate; retrying cannot help.
    #[error("authentication with Kafka at {brokers} failed: {reason}")]
    Auth {
        /// The bootstrap servers tried.
        brokers: String,
        /// librdkafka's reason.
        reason: String,
    },
}

/// A problem with the markers topic settings, and whether it is fatal on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingProblem {
    /// True when the tracker cannot work correctly at all with this setting.
    pub fatal: bool,
    /// What is wrong and how to fix it.
    pub message: String,
    /// The flag with which an operator accepts this problem and starts anyway.
    pub allowed_by: Option<&'static str>,
}

fn client(kafka: &KafkaArgs) -> ClientConfig {
    crate::kafka::client_config(&kafka.brokers, &[], &kafka.rdkafka)
}

/// Only the probe producer in [`topic_names`] reports auth failures, so the admin client needs
/// no context of its own.
fn admin(kafka: &KafkaArgs) -> Result<AdminClient<DefaultClientContext>, TopicsError> {
    Ok(client(kafka).create()?)
}

/// Lists the cluster's topics; tells a broker that cannot be reached (worth retrying) from
/// credentials that are refused (not worth it).
fn topic_names(kafka: &KafkaArgs) -> Result<Vec<String>, TopicsError> {
    // List every topic rather than ask for one: asking for a missing topic by name can make a
    // broker with auto-creation create it, with the wrong settings. A producer (never used to
    // produce) asks: unlike the admin client, polling it hands librdkafka's error events,
    // among them authentication failures, to the context.
    let probe: BaseProducer<AuthWatch> = client(kafka).create_with_context(AuthWatch::default())?;
    // Ask in short rounds and poll in between, so a refused password ends the wait at once.
    let listed = tokio::task::block_in_place(|| {
        let mut listed = probe.client().fetch_metadata(None, Duration::from_secs(1));
        for _ in 1..10 {
            probe.poll(Duration::from_millis(50));
            if listed.is_ok() || probe.context().failure().is_some() {
                break;
            }
            listed = probe.client().fetch_metadata(None, Duration::from_secs(1));
        }
        probe.poll(Duration::from_millis(50));
        listed
    });
    let auth = |reason: String| TopicsError::Auth {
        brokers: kafka.brokers.clone(),
        reason,
    };
    if let Some(reason) = probe.context().failure() {
        return Err(auth(reason));
    }
    match listed {
        Ok(md) => Ok(md.topics().iter().map(|t| t.name().to_string()).collect()),
        Err(error) if crate::kafka::is_auth_failure(&error) => Err(auth(error.to_string())),
        Err(error) => Err(TopicsError::Unreachable {
            brokers: kafka.brokers.clone(),
            error,
        }),
    }
}

fn options() -> AdminOptions {
    AdminOptions::new().request_timeout(Some(Duration::from_secs(30)))
}

/// Creates the markers topic, its snapshots topic and one dead-letter topic per source topic. Topics that already
/// exist are left as they are and reported.
pub async fn create(args: &TopicsArgs) -> Result<Vec<String>, TopicsError> {
    let admin = admin(&args.kafka)?;
    let retention = args.retention.as_millis().to_string();
    let replication = || TopicReplication::Fixed(args.replication_factor);
    let markers = NewTopic::new(&args.kafka.markers_topic, args.partitions, replication())
        .set("message.timestamp.type", "LogAppendTime")
        .set("retention.ms", &retention)
        .set("cleanup.policy", "delete");
    let dlq_names: Vec<String> = args
        .source_topics
        .iter()
        .map(|t| args.kafka.dlq_topic.replace("{topic}", t))
        .collect();
    // Compacted: only the latest chunks per key matter (see `tracker::snapshot_store`). Short
    // segments let compaction drop superseded snapshots within hours.
    let snapshots_name = args.kafka.snapshots_topic();
    let snapshots = NewTopic::new(&snapshots_name, args.partitions, replication())
        .set("cleanup.policy", "compact")
        .set("segment.ms", "3600000")
        .set("max.message.bytes", "2097152");
    let mut topics = vec![markers, snapshots];
    topics.extend(dlq_names.iter().map(|n| NewTopic::new(n, 1, replication())));
    let mut report = Vec::new();
    for result in admin.create_topics(&topics, &options()).await? {
        match result {
            Ok(name) => report.push(format!("created {name}")),
            Err((name, RDKafkaErrorCode::TopicAlreadyExists)) => {
                report.push(format!("exists  {name}"))
            }
            Err((topic, code)) => return Err(TopicsError::Create { topic, code }),
        }
    }
    Ok(report)
}

/// Reads the markers topic's configuration and reports what is wrong with it. A missing topic
/// is an error. An unreachable broker gives [`TopicsError::Unreachable`] after about 10 s;
/// refused credentials give [`TopicsError::Auth`] as soon as the broker says so.
pub async fn check_markers(
    kafka: &KafkaArgs,
    min_retention: Duration,
) -> Result<Vec<SettingProblem>, TopicsError> {
    let admin = admin(kafka)?;
    let topic = &kafka.markers_topic;
    if !topic_names(kafka)?.contains(topic) {
        return Err(TopicsError::Markers(format!(
            "markers topic `{topic}` does not exist; create it with `redelivery-tracker topics create`"
        )));
    }
    // The request as a whole fails only when the broker cannot be reached: worth a retry.
    let results = admin
        .describe_configs(&[ResourceSpecifier::Topic(topic)], &options())
        .await
        .map_err(|error| TopicsError::Unreachable {
            brokers: kafka.brokers.clone(),
            error,
        })?;
    let resource = match results.into_iter().next() {
        Some(Ok(r)) => r,
        Some(Err(code)) => {
            return Err(TopicsError::Markers(format!(
                "markers topic `{topic}` cannot be described ({code}); create it with `redelivery-tracker topics create`"
            )))
        }
        None => return Err(TopicsError::Markers(format!("no answer describing markers topic `{topic}`"))),
    };
    let entries: HashMap<String, String> = resource
        .entries
        .into_iter()
        .filter_map(|e| Some((e.name, e.value?)))
        .collect();
    Ok(markers_problems(topic, &entries, min_retention))
}

/// The pure part of [`check_markers`].
pub fn markers_problems(
    topic: &str,
    config: &HashMap<String, String>,
    min_retention: Duration,
) -> Vec<SettingProblem> {
    let mut out = Vec::new();
    let get = |k: &str| config.get(k).map(String::as_str);
    if get("message.timestamp.type") != Some("LogAppendTime") {
        // Refused by default: one client with a clock far ahead would make every later
        // delivery of its markers partition look due at once (the clock guard limits the
        // damage, but only LogAppendTime keeps deadlines on one clock).
        out.push(SettingProblem {
            fatal: true,
            message: format!(
                "markers topic `{topic}` has message.timestamp.type={}: deadlines would follow the clocks of the hosts that write markers; set it to LogAppendTime (or start with --allow-create-time)",
                get("message.timestamp.type").unwrap_or("?")
            ),
            allowed_by: Some("--allow-create-time"),
        });
    }
    if get("cleanup.policy").is_some_and(|p| p.contains("compact")) {
        out.push(SettingProblem {
            fatal: true,
            message: format!("markers topic `{topic}` is compacted; markers have no keys and must be kept in order: use cleanup.policy=delete"),
            allowed_by: None,
        });
    }
    let min_ms = i64::try_from(min_retention.as_millis()).unwrap_or(i64::MAX);
    match get("retention.ms").and_then(|r| r.parse::<i64>().ok()) {
        Some(r) if r >= 0 && r < min_ms => out.push(SettingProblem {
            fatal: false,
            message: format!(
                "markers topic `{topic}` keeps markers only {}: a delivery in flight longer than that would be lost from the tracker's replay; raise retention.ms",
                humantime::format_duration(Duration::from_millis(r as u64))
            ),
            allowed_by: None,
        }),
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn good_settings_have_no_problem() {
        let c = config(&[
            ("message.timestamp.type", "LogAppendTime"),
            ("retention.ms", "604800000"),
            ("cleanup.policy", "delete"),
        ]);
        assert!(markers_problems("m", &c, Duration::from_secs(86_400)).is_empty());
    }

    #[test]
    fn each_bad_setting_is_reported() {
        let c = config(&[
            ("message.timestamp.type", "CreateTime"),
            ("retention.ms", "60000"),
            ("cleanup.policy", "compact"),
        ]);
        let problems = markers_problems("m", &c, Duration::from_secs(86_400));
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert_eq!(problems.iter().filter(|p| p.fatal).count(), 2);
        assert_eq!(problems[0].allowed_by, Some("--allow-create-time"));
        assert!(problems[0].message.contains("LogAppendTime"));
        assert!(problems[2].message.contains("1m"));
    }

    #[test]
    fn infinite_retention_is_fine() {
        let c = config(&[
            ("message.timestamp.type", "LogAppendTime"),
            ("retention.ms", "-1"),
        ]);
        assert!(markers_problems("m", &c, Duration::from_secs(86_400)).is_empty());
    }
}
