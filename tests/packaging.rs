//! Static checks of what operators deploy, since this machine has no Docker engine: the compose
//! file against the Compose specification's schema and against what the binaries accept, and
//! the README's configuration reference against `--help`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use common::help::{help, help_flags};
use common::{example_bin, repo, tracker_bin};

fn compose_as_json() -> serde_json::Value {
    // ruamel comes with check-jsonschema (scripts/deps installs it) and resolves `<<:` merges.
    let script = "import json,sys\nfrom ruamel.yaml import YAML\nprint(json.dumps(YAML(typ='safe').load(open(sys.argv[1]))))";
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(repo("docker-compose.yml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn check_schema(file: &Path) -> bool {
    // As a module, so it works right after `pip install` whatever the PATH holds.
    let out = Command::new("python3")
        .args([
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
        ])
        .arg(file)
        .output()
        .expect("check-jsonschema is missing: run scripts/deps");
    out.status.success()
}

#[test]
fn compose_file_follows_the_compose_specification() {
    assert!(check_schema(&repo("docker-compose.yml")));
    // The check can fail: a misspelt key is caught.
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("docker-compose.yml");
    let text = std::fs::read_to_string(repo("docker-compose.yml")).unwrap();
    std::fs::write(&broken, text.replace("    healthcheck:", "    healthchek:")).unwrap();
    assert!(
        !check_schema(&broken),
        "the schema check accepted a misspelt key"
    );
}

#[test]
fn compose_mounts_exist_and_the_binaries_accept_every_setting_given_to_them() {
    let compose = compose_as_json();
    let services = compose["services"].as_object().unwrap();
    let tracker = Path::new(tracker_bin());
    for (name, service) in services {
        for volume in service["volumes"].as_array().into_iter().flatten() {
            let source = volume.as_str().unwrap().split(':').next().unwrap();
            if source.starts_with("./") {
                assert!(
                    repo(source).exists(),
                    "{name} mounts {source}, which is not in the repository"
                );
            }
        }
        let image = service["image"].as_str().unwrap_or("");
        if !image.starts_with("kafka-redelivery") {
            continue;
        }
        // Which program the service runs, and with which subcommand.
        let command: Vec<&str> = service["command"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str())
            .collect();
        let entrypoint = service["entrypoint"].as_array().and_then(|e| e[0].as_str());
        let text = match entrypoint {
            Some("example-worker") => help(&example_bin("worker"), &[]),
            Some(_) => help(&example_bin("producer"), &[]),
            None if command.first() == Some(&"topics") => help(tracker, &["topics", "create"]),
            None => help(tracker, &["run"]),
        };
        let accepted = help_flags(&text);
        for env in service["environment"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, _)| k)
        {
            assert!(
                accepted.iter().any(|(_, e)| e == env),
                "{name} sets {env}, which its program does not read"
            );
        }
        for flag in command.iter().filter(|a| a.starts_with("--")) {
            assert!(
                accepted.iter().any(|(f, _)| f == flag) || text.contains(flag),
                "{name} passes {flag}, unknown to its program"
            );
        }
        if entrypoint.is_none() && command.is_empty() {
            // A tracker: its published port is the admin port it listens on.
            let listen = service["environment"]["REDELIVERY_ADMIN_LISTEN"]
                .as_str()
                .unwrap();
            let admin_port = listen.rsplit(':').next().unwrap();
            for port in service["ports"].as_array().unwrap() {
                let container = port.as_str().unwrap().rsplit(':').next().unwrap();
                assert_eq!(
                    container, admin_port,
                    "{name} publishes {container} but listens on {admin_port}"
                );
            }
        }
    }
    let prometheus = std::fs::read_to_string(repo("docker/prometheus.yml")).unwrap();
    for target in ["tracker-1:9464", "tracker-2:9464"] {
        assert!(
            prometheus.contains(target),
            "Prometheus does not scrape {target}"
        );
        assert!(services.contains_key(target.split(':').next().unwrap()));
    }
}

#[test]
fn readme_configuration_reference_matches_run_help() {
    let readme = std::fs::read_to_string(repo("README.md")).unwrap();
    let documented: BTreeSet<(String, String)> = readme
        .lines()
        .filter(|l| l.starts_with("| `-"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let flag = cells[1]
                .trim_matches('`')
                .split(' ')
                .next()
                .unwrap()
                .to_string();
            let env = cells[2]
                .trim_matches('`')
                .split(['`', ' '])
                .next()
                .unwrap()
                .to_string();
            (flag, env)
        })
        .collect();
    let actual = help_flags(&help(Path::new(tracker_bin()), &["run"]));
    assert_eq!(
        documented, actual,
        "README's flag table and `run --help` disagree"
    );
}
