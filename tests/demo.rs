//! The README's first command: `redelivery-tracker demo`, on librdkafka's mock cluster.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

#[test]
fn demo_settles_every_message_and_reports_json() {
    let out = Command::new(env!("CARGO_BIN_EXE_redelivery-tracker"))
        .args(["demo", "--messages", "400", "--fail-rate", "0.4", "--json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed: {stderr}");
    assert!(
        stderr.contains("demo: produced 400"),
        "no live progress: {stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().expect("a JSON line");
    let v: serde_json::Value = serde_json::from_str(last).unwrap();
    let n = |k: &str| {
        v[k].as_u64()
            .unwrap_or_else(|| panic!("no `{k}` in {last}"))
    };
    assert_eq!(n("produced"), 400);
    assert_eq!(n("lost"), 0);
    // A share of the keys is rejected or abandoned until the maximum, so both paths run.
    assert!(n("dead_lettered") > 0, "{last}");
    assert!(n("redelivered") > 0, "{last}");
    assert!(n("acked") + n("dead_lettered") >= 400, "{last}");
}
