//! Test-only crash and failure points. With the `failpoints` feature, the environment variable
//! `KR_FAILPOINT` (read once; several entries separated by commas) arms them:
//! - `<point>`: [`hit`] aborts the process when it reaches that step of the protocol, so tests
//!   can kill a real client at each step;
//! - `panic:<point>`: [`hit`] panics there instead, to show that a panicking thread is
//!   reported rather than ending silently;
//! - `fail:<step>`: [`fails`] makes that step fail every time, `fail:<step>-once` the first
//!   time only, as a broker error would.
//!
//! Without the feature all of this compiles to nothing. Never enable it in production.

/// The points, in protocol order: a batch was polled; its Starts were queued; its Starts are
/// durable; its offsets are committed; an End was queued (by `ack`).
pub const POINTS: [&str; 5] = [
    "after-poll",
    "after-start-sent",
    "after-start-durable",
    "after-commit",
    "after-end-sent",
];

/// Points in the tracker: the records of due schedules are durable on their target topic and
/// their Ends are not yet written.
pub const TRACKER_POINTS: [&str; 1] = ["after-publish-durable"];

/// Steps that can be made to fail: a Start marker is not acknowledged (`start`), seeking the
/// source partition back to it fails (`seek`).
pub const FAILING_STEPS: [&str; 2] = ["start", "seek"];

#[cfg(feature = "failpoints")]
fn armed() -> &'static [String] {
    // Read once: points are reached per record, and a test sets the variable before the
    // process starts.
    static ARMED: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    ARMED.get_or_init(|| {
        std::env::var("KR_FAILPOINT")
            .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
            .unwrap_or_default()
    })
}

/// Aborts the process if `KR_FAILPOINT` names `name`, panics if it names `panic:name`
/// (feature `failpoints` only).
#[cfg(feature = "failpoints")]
pub fn hit(name: &str) {
    for armed in armed() {
        if armed == name {
            eprintln!("failpoint {name}: aborting");
            std::process::abort();
        }
        if armed.strip_prefix("panic:") == Some(name) {
            #[allow(clippy::panic)]
            {
                panic!("failpoint {name}: panicking on purpose");
            }
        }
    }
}

/// Whether step `name` should fail now: `KR_FAILPOINT` names `fail:name` (always) or
/// `fail:name-once` (the first time only) (feature `failpoints` only).
#[cfg(feature = "failpoints")]
pub fn fails(name: &str) -> bool {
    use std::sync::atomic::{AtomicBool, Ordering};
    static FIRED_ONCE: AtomicBool = AtomicBool::new(false);
    armed().iter().any(|armed| {
        let Some(step) = armed.strip_prefix("fail:") else {
            return false;
        };
        if step == name {
            eprintln!("failpoint fail:{name}: failing");
            return true;
        }
        // One `-once` step per process is all the tests need.
        step.strip_suffix("-once") == Some(name) && !FIRED_ONCE.swap(true, Ordering::Relaxed)
    })
}

/// Does nothing: the `failpoints` feature is off.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) {}

/// Never fails: the `failpoints` feature is off.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn fails(_name: &str) -> bool {
    false
}
