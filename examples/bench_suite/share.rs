//! The share-group peer (Kafka's own queues, KIP-932): the Java `KafkaShareConsumer` in
//! `benches/peers/`, run as a child process and driven over a line protocol (see
//! `ShareConsumerBench.java`). Its time runs from creating the share consumer, as every
//! kind's does from subscribing; its CPU time is measured by the JVM itself from the first
//! record on, so JVM start-up and class loading are not charged to it. It polls up to
//! [`BATCH`] records at a time (`max.poll.records`), the batch ours and the floor take. In a
//! throughput run it first consumes records of a warm-up topic, untimed, so that its JVM has
//! compiled its hot code before the clock starts (`--share-warm-up`).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::consumers::{Consumed, Seen, Target, BATCH};
use super::kafka::{jit_cpu_seconds, unique};
use super::Error;

static DIR: OnceLock<PathBuf> = OnceLock::new();

/// Builds the Java peers if needed (`benches/peers/build`), once per run.
pub fn prepare() -> Result<(), Error> {
    if DIR.get().is_none() {
        let _ = DIR.set(build()?);
    }
    Ok(())
}

/// Where [`prepare`] put the compiled peers.
pub fn dir() -> Result<PathBuf, Error> {
    DIR.get()
        .cloned()
        .ok_or_else(|| "the Java peers were not built (share::prepare)".into())
}

fn build() -> Result<PathBuf, Error> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/peers/build");
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!("{} failed: {}", script.display(), out.status).into());
    }
    let dir = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .map(str::trim)
        .unwrap_or_default()
        .to_string();
    if dir.is_empty() {
        return Err(format!("{} printed no directory", script.display()).into());
    }
    Ok(PathBuf::from(dir))
}

/// Consumes `topic` with one share consumer until `target` records were acknowledged; first,
/// untimed, `warm_up`'s records of its topic, when given.
pub fn consume(
    peers: &Path,
    brokers: &str,
    topic: &str,
    warm_up: Option<(String, usize)>,
    target: &Target,
    seen: &Seen,
    limit: Duration,
) -> Result<Consumed, Error> {
    let latencies = tempfile::NamedTempFile::new()?;
    let known = target.load(Ordering::Relaxed);
    let classpath = format!(
        "{}:{}",
        peers.join("classes").display(),
        peers.join("lib/*").display()
    );
    let mut child = Command::new("java")
        .arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
        .args(["-cp", &classpath, "bench.ShareConsumerBench"])
        .args([brokers, topic, &unique("bench-share")])
        .arg(if known == usize::MAX {
            "-1".to_string()
        } else {
            known.to_string()
        })
        .arg(limit.as_secs().to_string())
        .arg(latencies.path())
        .arg(BATCH.to_string())
        .args(warm_up.map_or_else(Vec::new, |(t, n)| vec![t, n.to_string()]))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start java for the share peer: {e}"))?;
    // The latency runs learn the target when the load stops: pass it on through stdin.
    let finished = Arc::new(AtomicBool::new(false));
    let mut stdin = child.stdin.take().ok_or("share peer: no stdin")?;
    let feeder = {
        let (target, finished) = (target.clone(), finished.clone());
        std::thread::spawn(move || {
            while known == usize::MAX && !finished.load(Ordering::Relaxed) {
                let t = target.load(Ordering::Relaxed);
                if t != usize::MAX {
                    let _ = writeln!(stdin, "{t}");
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let stdout = child.stdout.take().ok_or("share peer: no stdout")?;
    let mut done = None;
    // The peer's JIT compiling from its first record to its result, read while it runs (it
    // reports its CPU over the same span).
    let pid = child.id();
    let mut jit_at_first = 0.0;
    let mut jit = None;
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["first"] => {
                jit_at_first = jit_cpu_seconds(pid);
                seen.fetch_add(1, Ordering::Relaxed);
            }
            ["done", n, ms, cpu_ms, mark, steady_ms] => {
                // 0 if the JVM exited before it was read: then nothing is reported.
                let now = jit_cpu_seconds(pid);
                jit = (now > 0.0).then_some(now - jit_at_first);
                let (mark, steady_ms): (i64, i64) = (mark.parse()?, steady_ms.parse()?);
                let steady = (mark >= 0 && steady_ms >= 0)
                    .then(|| (mark as usize, Duration::from_millis(steady_ms as u64)));
                done = Some((n.parse()?, ms.parse()?, cpu_ms.parse()?, steady));
            }
            _ => eprintln!("share peer: {line}"),
        }
    }
    finished.store(true, Ordering::Relaxed);
    let status = child.wait()?;
    let _ = feeder.join();
    let (received, elapsed_ms, cpu_ms, steady): (usize, u64, u64, Option<(usize, Duration)>) =
        done.ok_or_else(|| format!("the share peer ended without a result ({status})"))?;
    let latencies_ms = std::fs::read_to_string(latencies.path())?
        .lines()
        .map(|l| l.trim().parse::<f64>())
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Consumed {
        received,
        elapsed: Duration::from_millis(elapsed_ms),
        steady: steady.map(|(mark, d)| (received.saturating_sub(mark), d)),
        latencies_ms,
        cpu_seconds: Some(cpu_ms as f64 / 1000.0),
        jit_cpu_seconds: jit,
    })
}

/// What the peers' build found out about kmq (`kmq.txt`): it is skipped when it does not resolve.
pub fn kmq_status() -> String {
    dir()
        .ok()
        .and_then(|d| std::fs::read_to_string(d.join("kmq.txt")).ok())
        .map_or_else(|| "unknown".to_string(), |s| s.trim().to_string())
}
