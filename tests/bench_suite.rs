//! The benchmark suite's `--quick` mode runs every scenario against the real broker and writes
//! its results and plots. No timing is asserted: this proves the harness works. One record
//! size only: the 1 KiB runs take the same code paths and doubled this test's three minutes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;

#[test]
fn the_quick_suite_runs_every_scenario_and_writes_results_and_plots() {
    let out = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(example_bin("bench_suite"))
        .args(["--quick", "--sizes", "100", "--brokers", &brokers()])
        .arg("--out")
        .arg(out.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::from(log_file("bench-suite")))
        .status()
        .unwrap();
    assert!(status.success(), "bench_suite --quick failed: {status}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("results.json")).unwrap())
            .unwrap();
    for size in ["100"] {
        for kind in ["plain", "floor", "batch_floor", "ours", "share"] {
            let rate = json["sizes"][size]["throughput"][kind]["median"]
                .as_f64()
                .unwrap();
            assert!(rate > 0.0, "{size} {kind}: {json}");
            let from_subscription =
                &json["sizes"][size]["throughput_from_subscription"][kind]["median"];
            assert!(
                from_subscription.as_f64().is_some_and(|r| r > 0.0),
                "{size} {kind}"
            );
            for load in ["half_plain", "sustained"] {
                let latency = &json["sizes"][size]["latency"][load];
                for figure in ["p99_ms", "steady_p99_ms"] {
                    let p99 = &latency[figure][kind]["median"];
                    assert!(p99.is_number(), "{size} {kind} {load} {figure}: {json}");
                }
            }
        }
    }
    // kmq runs only where it resolves; the report says which (issue 5).
    assert!(
        json["kmq"].as_str().is_some_and(|s| s.contains("kmq")),
        "{json}"
    );
    assert!(json["redelivery"]["throughput"]["median"].as_f64().unwrap() > 0.0);
    assert!(
        json["redelivery"]["at_offered_load"]["redeliveries"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(
        json["tracker_alone"]["markers_per_second"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(
        json["tracker_alone"]["restart_from_snapshot_ms"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    for plot in [
        "throughput.png",
        "latency-cdf-100-half_plain.png",
        "latency-cdf-100-sustained.png",
    ] {
        let bytes = std::fs::read(out.path().join(plot)).unwrap();
        assert_eq!(&bytes[1..4], b"PNG", "{plot} is not a PNG");
    }
}
