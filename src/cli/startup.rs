//! The start-up check of `run`: wait for Kafka with back-off, then check the markers topic.
//!
//! A tracker often starts before its broker (a compose file, a node reboot), so an unreachable
//! broker is waited for, with a log line per attempt, while `/readyz` says "not ready". What
//! waiting cannot fix ends the process at once: refused credentials (exit 77) and a missing
//! or wrongly set markers topic (exit 78).

use std::process::ExitCode;
use std::time::Duration;

use super::args::RunArgs;
use super::topics::{self, TopicsError};
use super::{EX_CONFIG, EX_NOPERM};

/// The longest wait between two attempts to reach Kafka.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Returns once the markers topic is checked and fine; otherwise the exit code to end with.
pub async fn check_until_reachable(args: &RunArgs) -> Result<(), ExitCode> {
    let mut backoff = Duration::from_secs(1);
    let mut attempt = 1u32;
    let problems = loop {
        match topics::check_markers(&args.kafka, args.min_retention).await {
            Ok(problems) => break problems,
            Err(e @ TopicsError::Unreachable { .. }) => {
                tracing::warn!(
                    error = %e,
                    attempt,
                    retry_in = ?backoff,
                    "cannot reach Kafka yet; not ready, retrying"
                );
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                attempt += 1;
            }
            Err(e @ TopicsError::Auth { .. }) => {
                tracing::error!(error = %e, "giving up: Kafka refused the credentials");
                eprintln!("error: {e}");
                return Err(ExitCode::from(EX_NOPERM));
            }
            Err(e) => {
                tracing::error!(error = %e, "markers topic check failed");
                eprintln!("error: {e}");
                return Err(ExitCode::from(EX_CONFIG));
            }
        }
    };
    if attempt > 1 {
        tracing::info!(attempts = attempt, "Kafka reached");
    }
    let allowed = |p: &topics::SettingProblem| {
        p.allowed_by == Some("--allow-create-time") && args.allow_create_time
    };
    for p in &problems {
        tracing::warn!(fatal = p.fatal && !allowed(p), "{}", p.message);
    }
    if let Some(p) = problems
        .iter()
        .find(|p| (p.fatal && !allowed(p)) || args.strict_topic_check)
    {
        eprintln!("error: refusing to start: {}", p.message);
        return Err(ExitCode::from(EX_CONFIG));
    }
    Ok(())
}
