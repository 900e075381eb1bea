//! The fault schedule: which fault happens when, drawn from a seed so a failing run can be
//! replayed exactly (`FAULTS_SEED=<seed>`).

use std::fmt;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The kinds of fault the harness injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// SIGKILL of a worker process; a new worker takes its place.
    WorkerKill,
    /// SIGSTOP of a worker past its delivery timeout, then SIGCONT: it wakes up and acks late.
    WorkerStop,
    /// SIGKILL of a tracker replica; it is started again a moment later.
    TrackerKill,
    /// The broker stopped and started again on the same data.
    BrokerRestart,
}

impl FaultKind {
    /// Every kind, in report order.
    pub const ALL: [FaultKind; 4] = [
        FaultKind::WorkerKill,
        FaultKind::WorkerStop,
        FaultKind::TrackerKill,
        FaultKind::BrokerRestart,
    ];
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FaultKind::WorkerKill => "worker SIGKILL",
            FaultKind::WorkerStop => "worker SIGSTOP/SIGCONT",
            FaultKind::TrackerKill => "tracker SIGKILL + restart",
            FaultKind::BrokerRestart => "broker restart",
        })
    }
}

/// One planned fault.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// When, from the start of the run.
    pub at: Duration,
    /// What.
    pub kind: FaultKind,
    /// Which process of its kind (an index into the workers or the trackers).
    pub target: usize,
}

/// Plans faults over `span`: one every `every` on average (uniformly jittered), with exactly
/// one broker restart in the middle third. Workers are hit more often than trackers, as in
/// real deployments.
pub fn plan(
    seed: u64,
    span: Duration,
    every: Duration,
    workers: usize,
    trackers: usize,
) -> Vec<Fault> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut faults = Vec::new();
    let mut at = every;
    while at < span {
        let kind = match rng.gen_range(0..10) {
            0..=4 => FaultKind::WorkerKill,
            5..=7 => FaultKind::WorkerStop,
            _ => FaultKind::TrackerKill,
        };
        let target = match kind {
            FaultKind::TrackerKill => rng.gen_range(0..trackers),
            _ => rng.gen_range(0..workers),
        };
        faults.push(Fault { at, kind, target });
        at += every.mul_f64(rng.gen_range(0.5..1.5));
    }
    let broker_at = span.mul_f64(rng.gen_range(0.34..0.66));
    faults.push(Fault {
        at: broker_at,
        kind: FaultKind::BrokerRestart,
        target: 0,
    });
    faults.sort_by_key(|f| f.at);
    faults
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_plan_with_one_broker_restart() {
        let a = plan(7, Duration::from_secs(60), Duration::from_secs(3), 3, 2);
        let b = plan(7, Duration::from_secs(60), Duration::from_secs(3), 3, 2);
        assert_eq!(a, b);
        let restarts = a
            .iter()
            .filter(|f| f.kind == FaultKind::BrokerRestart)
            .count();
        assert_eq!(restarts, 1);
        assert!(a.windows(2).all(|w| w[0].at <= w[1].at));
        assert!(a.iter().all(|f| f.at < Duration::from_secs(60)));
        assert!(a.iter().any(|f| f.kind == FaultKind::WorkerKill));
    }
}
