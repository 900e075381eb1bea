//! The fault schedule: which fault happens when, drawn from a seed so a failing run can be
//! replayed exactly (`FAULTS_SEED=<seed>`).

use std::fmt;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
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
    /// On a cluster: SIGKILL of the broker leading a markers partition (the clients' Starts
    /// and Ends, the tracker's reads and commits), started again a while later.
    MarkersLeaderKill,
    /// On a cluster: SIGKILL of the broker leading a source partition (the workers' reads, the
    /// tracker's copies), started again a while later.
    SourceLeaderKill,
    /// On a cluster: SIGKILL of the active controller (the KRaft quorum's leader), started
    /// again a while later.
    ControllerKill,
    /// On a cluster: SIGSTOP of the broker leading a markers partition for a few seconds, then
    /// SIGCONT: a leader that stops answering without closing its connections.
    LeaderPause,
    /// On a cluster on a network: the broker leading a markers partition cut off from
    /// everything (the other brokers, the controller quorum, every client) for longer than
    /// its session timeout, then healed.
    BrokerPartition,
    /// On a cluster on a network: a tracker replica cut off for longer than its group session
    /// timeout (it keeps running, unaware), then healed.
    TrackerPartition,
    /// On a cluster on a network: a worker cut off for longer than its group session timeout
    /// and its deliveries' timeout, then healed.
    WorkerPartition,
}

impl FaultKind {
    /// Every kind, in report order.
    pub const ALL: [FaultKind; 11] = [
        FaultKind::WorkerKill,
        FaultKind::WorkerStop,
        FaultKind::TrackerKill,
        FaultKind::BrokerRestart,
        FaultKind::MarkersLeaderKill,
        FaultKind::SourceLeaderKill,
        FaultKind::ControllerKill,
        FaultKind::LeaderPause,
        FaultKind::BrokerPartition,
        FaultKind::TrackerPartition,
        FaultKind::WorkerPartition,
    ];

    /// The faults only a cluster on a network can have.
    pub const CLUSTER: [FaultKind; 7] = [
        FaultKind::MarkersLeaderKill,
        FaultKind::SourceLeaderKill,
        FaultKind::ControllerKill,
        FaultKind::LeaderPause,
        FaultKind::BrokerPartition,
        FaultKind::TrackerPartition,
        FaultKind::WorkerPartition,
    ];

    /// Whether the fault is on the tracker's or the brokers' side, where a duplicate comes from
    /// a delivery redone after it (rather than from a worker that held the record).
    pub fn is_infrastructure(self) -> bool {
        !matches!(self, FaultKind::WorkerKill | FaultKind::WorkerStop)
    }
}

/// What the brokers are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Brokers {
    /// One broker: one restart in the middle of the run.
    Single,
    /// A cluster of three, each node and process in a network namespace of its own: a fault
    /// of [`FaultKind::CLUSTER`] (each kind in turn, in an order drawn from the seed) every
    /// `every` on average, each healed before the next.
    Cluster { every: Duration },
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FaultKind::WorkerKill => "worker SIGKILL",
            FaultKind::WorkerStop => "worker SIGSTOP/SIGCONT",
            FaultKind::TrackerKill => "tracker SIGKILL + restart",
            FaultKind::BrokerRestart => "broker restart",
            FaultKind::MarkersLeaderKill => "markers leader SIGKILL",
            FaultKind::SourceLeaderKill => "source leader SIGKILL",
            FaultKind::ControllerKill => "controller SIGKILL",
            FaultKind::LeaderPause => "markers leader SIGSTOP",
            FaultKind::BrokerPartition => "markers leader cut off",
            FaultKind::TrackerPartition => "tracker cut off",
            FaultKind::WorkerPartition => "worker cut off",
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
    /// Which process of its kind (an index into the workers or the trackers; for a leader
    /// fault, the partition whose leader is hit, modulo the partition count).
    pub target: usize,
}

/// Plans faults over `span`: one every `every` on average (uniformly jittered), and the broker
/// faults `brokers` says. Workers are hit more often than trackers, as in real deployments.
pub fn plan(
    seed: u64,
    span: Duration,
    every: Duration,
    workers: usize,
    trackers: usize,
    brokers: Brokers,
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
    match brokers {
        Brokers::Single => faults.push(Fault {
            at: span.mul_f64(rng.gen_range(0.34..0.66)),
            kind: FaultKind::BrokerRestart,
            target: 0,
        }),
        Brokers::Cluster { every } => {
            let mut at = every.mul_f64(0.5);
            let mut turn = Vec::new();
            while at < span {
                if turn.is_empty() {
                    turn = FaultKind::CLUSTER.to_vec();
                    turn.shuffle(&mut rng);
                }
                let kind = turn.pop().unwrap_or(FaultKind::LeaderPause);
                faults.push(Fault {
                    at,
                    kind,
                    target: rng.gen_range(0..64),
                });
                at += every.mul_f64(rng.gen_range(0.8..1.2));
            }
        }
    }
    faults.sort_by_key(|f| f.at);
    faults
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_plan_with_one_broker_restart() {
        let single = Brokers::Single;
        let a = plan(
            7,
            Duration::from_secs(60),
            Duration::from_secs(3),
            3,
            2,
            single,
        );
        let b = plan(
            7,
            Duration::from_secs(60),
            Duration::from_secs(3),
            3,
            2,
            single,
        );
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

    #[test]
    fn a_cluster_plan_has_every_broker_fault_in_turn_and_no_single_broker_restart() {
        let every = Duration::from_secs(20);
        let span = Duration::from_secs(150);
        let a = plan(
            9,
            span,
            Duration::from_secs(10),
            3,
            2,
            Brokers::Cluster { every },
        );
        let broker: Vec<&Fault> = a
            .iter()
            .filter(|f| FaultKind::CLUSTER.contains(&f.kind))
            .collect();
        assert!(a.iter().all(|f| f.kind != FaultKind::BrokerRestart));
        let kinds = FaultKind::CLUSTER.len();
        assert!(broker.len() >= kinds, "{broker:?}");
        for kind in FaultKind::CLUSTER {
            assert!(
                broker[..kinds].iter().any(|f| f.kind == kind),
                "{kind} missing: {broker:?}"
            );
        }
        // Each broker fault is healed (within 20 s) before the next one starts.
        assert!(broker
            .windows(2)
            .all(|w| w[1].at - w[0].at >= every.mul_f64(0.8)));
    }
}
