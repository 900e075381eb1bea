//! Settings the broker cannot serve are refused before subscribing, with a message, instead of
//! a consumer that waits for an assignment that never comes.
//!
//! Today that is KIP-848's `group.protocol=consumer`: a broker without the new consumer-group
//! protocol (Apache Kafka before 4.0, unless it was turned on) never answers its heartbeats,
//! and librdkafka says nothing about it.

use std::time::Duration;

use futures::executor::block_on;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;

use super::config::ConsumerConfig;
use super::error::ClientError;

/// The broker setting that lists the consumer-group protocols it serves.
const PROTOCOLS: &str = "group.coordinator.rebalance.protocols";

/// Refuses `group.protocol=consumer` against a broker that does not serve it. A broker that
/// will not say (no permission to describe its configuration) is given the benefit of the
/// doubt, with a warning.
pub(crate) fn check(config: &ConsumerConfig) -> Result<(), ClientError> {
    let wants_new_protocol = config
        .rdkafka
        .iter()
        .any(|(k, v)| k == "group.protocol" && v.eq_ignore_ascii_case("consumer"));
    if !wants_new_protocol {
        return Ok(());
    }
    match served_protocols(config) {
        Ok(Some(protocols)) if protocols.split(',').any(|p| p.trim() == "consumer") => Ok(()),
        Ok(found) => Err(ClientError::Unsupported(format!(
            "group.protocol=consumer (KIP-848) needs a broker that serves it, and this one \
             has {PROTOCOLS}={}; remove the setting (the classic protocol works everywhere) \
             or use Apache Kafka 4.0 or later",
            found
                .as_deref()
                .unwrap_or("(not set: a release before 3.7)")
        ))),
        Err(why) => {
            tracing::warn!(%why, "could not ask the broker whether it serves group.protocol=consumer; going on");
            Ok(())
        }
    }
}

/// The value of [`PROTOCOLS`] on one broker of the cluster, `None` if it has no such setting.
fn served_protocols(config: &ConsumerConfig) -> Result<Option<String>, String> {
    let admin: AdminClient<DefaultClientContext> = config
        .client_config(&[])
        .create()
        .map_err(|e| e.to_string())?;
    let timeout = Duration::from_secs(10);
    let metadata = admin
        .inner()
        .fetch_metadata(None, timeout)
        .map_err(|e| e.to_string())?;
    let broker = metadata
        .brokers()
        .first()
        .map(|b| b.id())
        .ok_or("the metadata names no broker")?;
    let options = AdminOptions::new().request_timeout(Some(timeout));
    let results = block_on(admin.describe_configs(&[ResourceSpecifier::Broker(broker)], &options))
        .map_err(|e| e.to_string())?;
    let resource = results
        .into_iter()
        .next()
        .ok_or("no answer")?
        .map_err(|e| e.to_string())?;
    Ok(resource.get(PROTOCOLS).and_then(|e| e.value.clone()))
}
