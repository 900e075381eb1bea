//! Test-only crash points. With the `failpoints` feature, [`hit`] aborts the process when the
//! environment variable `KR_FAILPOINT` names the point reached, so tests can kill a real client
//! at each step of the protocol; `KR_FAILPOINT=panic:<point>` panics there instead, to show
//! that a panicking thread is reported rather than ending silently. Without the feature it
//! compiles to nothing. Never enable the feature in production.

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

/// Aborts the process if `KR_FAILPOINT` is `name`, panics if it is `panic:name` (feature
/// `failpoints` only).
#[cfg(feature = "failpoints")]
pub fn hit(name: &str) {
    // Read once: `hit` runs per record, and a test sets the variable before the process starts.
    static ARMED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let Some(armed) = ARMED.get_or_init(|| std::env::var("KR_FAILPOINT").ok()) else {
        return;
    };
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

/// Does nothing: the `failpoints` feature is off.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) {}
