//! The `redelivery-tracker` command line: argument parsing, the admin server, topic
//! management and the demo. Compiled only with the `cli` feature.

pub mod admin;
pub mod args;
pub mod demo;
pub mod inspect;
pub mod logging;
pub mod redrive;
mod startup;
pub mod topics;

use std::process::ExitCode;

use clap::Parser;

use crate::tracker::{Tracker, TrackerConfig, TrackerError};
use args::{Cli, Command, DlqCommand, RunArgs, TopicsCommand};

/// Exit code for a bad flag or environment variable (BSD `EX_USAGE`).
pub const EX_USAGE: u8 = 64;
/// Exit code when the Kafka side is set up wrongly, e.g. a missing markers topic (`EX_CONFIG`).
pub const EX_CONFIG: u8 = 78;
/// Exit code when Kafka refuses the credentials or certificate, or the tracker its group or
/// markers topic from the start (`EX_NOPERM`).
pub const EX_NOPERM: u8 = 77;

/// Parses the arguments and runs the command. Bad arguments print one line naming the flag and
/// exit with [`EX_USAGE`].
pub fn main() -> ExitCode {
    // Before any thread: glibc's arenas once made are never merged (tracker/memory.rs).
    crate::tracker::memory::limit_arenas();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{}", one_line(&e.render().to_string()));
            return ExitCode::from(EX_USAGE);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(dispatch(cli.command));
    // What is still running once the command has returned was given up on: a start-up check
    // still waiting in librdkafka for a broker (up to 10 s), a thread the tracker's stop left
    // behind. Dropping the runtime would wait for them; the exit does not.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}

/// Folds clap's multi-line error into one line: the message and what it lists, without the
/// usage and tips that follow.
fn one_line(rendered: &str) -> String {
    let parts: Vec<&str> = rendered
        .lines()
        .take_while(|l| !l.starts_with("Usage:"))
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("tip:"))
        .collect();
    if parts.is_empty() {
        "error: invalid arguments".to_string()
    } else {
        parts.join(" ")
    }
}

async fn dispatch(command: Command) -> ExitCode {
    match command {
        Command::Run(args) => run(args).await,
        Command::Topics {
            command: TopicsCommand::Create(args),
        } => {
            logging::init(args::LogFormat::Pretty);
            match topics::create(&args).await {
                Ok(report) => {
                    for line in report {
                        println!("{line}");
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Demo(args) => demo::run(args).await,
        Command::Dlq {
            command: DlqCommand::Redrive(args),
        } => match redrive::run(&args).await {
            Ok(r) => {
                let verb = if args.dry_run {
                    "would redrive"
                } else {
                    "redrove"
                };
                println!(
                    "{verb} {} of {} records read ({} skipped by the filters)",
                    r.redriven, r.read, r.skipped
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Inspect(args) => match inspect::fetch(&args.admin).await {
            Ok(view) if args.json => {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&view).unwrap_or_default()
                );
                ExitCode::SUCCESS
            }
            Ok(view) => {
                print!("{}", inspect::table(&view));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

async fn run(args: RunArgs) -> ExitCode {
    logging::init(args.log_format);
    let config = TrackerConfig {
        group_id: args.group_id.clone(),
        max_deliveries: args.max_deliveries,
        dlq_topic: args.kafka.dlq_topic.clone(),
        commit_interval: args.commit_interval,
        read_ahead: args.read_ahead,
        source_group: args.source_group.clone(),
        source_group_wait: args.source_group_wait,
        snapshots_topic: Some(args.kafka.snapshots_topic()),
        snapshot_after_markers: args.snapshot_after_markers,
        snapshot_min_interval: args.snapshot_interval,
        rdkafka: args.kafka.rdkafka.clone(),
        ..TrackerConfig::new(args.kafka.brokers.clone(), args.kafka.markers_topic.clone())
    };
    let tracker = Tracker::new(config);
    let state = admin::AdminState {
        metrics: tracker.metrics(),
        ready: tracker.readiness(),
        view: tracker.view(),
    };
    // The admin server comes first, so that while Kafka cannot be reached /healthz answers
    // and /readyz says "not ready".
    // Signal handlers first: until they are installed SIGTERM kills the process outright
    // (exit by signal, which an orchestrator reports as a failure).
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    let admin_task = match admin::serve(args.admin_listen, state).await {
        Ok((bound, task)) => {
            if let Some(path) = &args.admin_address_file {
                if let Err(e) = write_address(path, bound) {
                    eprintln!("error: --admin-address-file {}: {e}", path.display());
                    return ExitCode::from(EX_USAGE);
                }
            }
            task
        }
        Err(e) => {
            eprintln!("error: --admin-listen {}: {e}", args.admin_listen);
            return ExitCode::from(EX_USAGE);
        }
    };
    // The start-up check blocks its thread while it asks Kafka (up to 10 s a round), so it
    // runs as a task of its own: a stop asked meanwhile is seen at once, not after the round.
    let check = tokio::spawn({
        let args = args.clone();
        async move { startup::check_until_reachable(&args).await }
    });
    let result = tokio::select! {
        checked = check => match checked {
            Ok(Ok(())) => tracker.run(shutdown).await,
            Ok(Err(code)) => {
                admin_task.abort();
                return code;
            }
            Err(e) => Err(TrackerError::Thread(format!("the start-up check failed: {e}"))),
        },
        () = &mut shutdown => Ok(()),
    };
    admin_task.abort();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "tracker failed");
            eprintln!("error: {e}");
            match e {
                // Like refused credentials: waiting cannot fix it.
                TrackerError::Refused(_) => ExitCode::from(EX_NOPERM),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

/// Completes on SIGINT or SIGTERM. The handlers are installed by this call, not when the
/// future is first polled, so a signal that arrives while the caller is busy elsewhere still
/// ends in a clean stop. Must be called inside the Tokio runtime.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (interrupt, term) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        );
        async move {
            let wait = |s: std::io::Result<tokio::signal::unix::Signal>| async move {
                match s {
                    Ok(mut s) => {
                        s.recv().await;
                    }
                    Err(_) => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = wait(interrupt) => tracing::info!("SIGINT received"),
                _ = wait(term) => tracing::info!("SIGTERM received"),
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("interrupt received");
    }
}

/// Writes `addr` to `path` whole or not at all (a reader never sees half an address).
fn write_address(path: &std::path::Path, addr: std::net::SocketAddr) -> std::io::Result<()> {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, addr.to_string())?;
    std::fs::rename(&partial, path)
}
