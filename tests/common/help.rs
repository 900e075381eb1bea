//! What a program of ours accepts, read from its `--help`: the deployment files (compose, the
//! Helm chart, the Kubernetes examples) are checked against it, so a setting they pass that the
//! program does not read fails a test instead of being ignored in production.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// The `--help` text of `bin` with `args` (a subcommand) before it.
pub fn help(bin: &Path, args: &[&str]) -> String {
    let out = Command::new(bin).args(args).arg("--help").output().unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// (flag, environment variable) pairs that `--help` lists.
pub fn help_flags(text: &str) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    let mut flag: Option<String> = None;
    for line in text.lines().map(str::trim) {
        if line.starts_with("--") || line.starts_with("-X") {
            let f = line.split([' ', ',']).next().unwrap().to_string();
            flag = (f != "--help" && f != "-h" && f != "--version").then_some(f);
        }
        // Long help puts `[env: X=]` on a line of its own, short help at the end of the flag's;
        // a flag whose values are hidden (they may be secrets) shows `[env: X]`.
        if let (Some(f), Some((_, env))) = (&flag, line.split_once("[env: ")) {
            out.insert((f.clone(), env.split(['=', ']']).next().unwrap().to_string()));
        }
    }
    out
}

/// The flags `--help` lists, with or without an environment variable.
pub fn help_switches(text: &str) -> BTreeSet<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| l.starts_with("--") || l.starts_with("-X"))
        .map(|l| l.split([' ', ',']).next().unwrap().to_string())
        .collect()
}
