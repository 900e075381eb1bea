//! The chart and manifests as objects: rendered with Helm, decoded strictly by kubecheck (both
//! from `scripts/kube-tools`), returned as JSON for the tests to look into.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::common::repo;

pub const CHART: &str = "deploy/helm/kafka-redelivery";
pub const ALL_ON: &str = "deploy/helm/kafka-redelivery/ci/all-on-values.yaml";

/// Runs `scripts/kube-tools ARGS` (which builds Helm and kubecheck on first use).
pub fn kube_tools(args: &[&str]) -> Output {
    Command::new(repo("scripts/kube-tools"))
        .args(args)
        .output()
        .expect("scripts/kube-tools runs")
}

/// Like [`kube_tools`], failing the test with its stderr unless it succeeds; returns stdout.
pub fn kube_tools_ok(args: &[&str]) -> String {
    let out = kube_tools(args);
    assert!(
        out.status.success(),
        "kube-tools {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `helm template` of the chart with `args` (values files, `--set`); the rendered text.
pub fn helm_template(args: &[&str]) -> Output {
    let chart = repo(CHART).display().to_string();
    let mut all = vec!["helm", "template", "r", chart.as_str()];
    all.extend_from_slice(args);
    kube_tools(&all)
}

/// The chart rendered with `args`, every object strictly decoded.
pub fn render(args: &[&str]) -> Vec<Value> {
    let out = helm_template(args);
    assert!(
        out.status.success(),
        "helm template {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    decode_text(&String::from_utf8(out.stdout).unwrap())
}

/// The chart with its default values (and the one value it requires).
pub fn render_default(extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["--set", "tracker.markersTopic=orders.markers"];
    args.extend_from_slice(extra);
    render(&args)
}

pub fn render_all_on(extra: &[&str]) -> Vec<Value> {
    let values = repo(ALL_ON).display().to_string();
    let mut args = vec!["-f", values.as_str()];
    args.extend_from_slice(extra);
    render(&args)
}

/// Strictly decodes manifests (files or text); panics with kubecheck's message if it refuses.
pub fn decode_files(files: &[&Path]) -> Vec<Value> {
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let mut args = vec!["kubecheck", "decode"];
    args.extend(names.iter().map(String::as_str));
    serde_json::from_str(&kube_tools_ok(&args)).unwrap()
}

pub fn decode_text(text: &str) -> Vec<Value> {
    let file = write_temp(text);
    decode_files(&[file.path()])
}

/// kubecheck's verdict on `text`: Ok(objects) or Err(its message).
pub fn try_decode(text: &str) -> Result<Vec<Value>, String> {
    let file = write_temp(text);
    let path = file.path().display().to_string();
    let out = kube_tools(&["kubecheck", "decode", &path]);
    if out.status.success() {
        Ok(serde_json::from_slice(&out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn write_temp(text: &str) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), text).unwrap();
    file
}

/// A YAML file of this repository as JSON (kubecheck yaml2json).
pub fn yaml_file(path: &str) -> Value {
    let path = repo(path).display().to_string();
    serde_json::from_str(&kube_tools_ok(&["kubecheck", "yaml2json", &path])).unwrap()
}

/// The objects of one kind.
pub fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

/// The one object of a kind; panics if there is not exactly one.
pub fn one<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let found = of_kind(objects, kind);
    assert_eq!(found.len(), 1, "expected one {kind}, found {}", found.len());
    found[0]
}

/// The pod template's container (or init container) named `name` of a workload.
pub fn container<'a>(workload: &'a Value, name: &str) -> &'a Value {
    let spec = &workload["spec"]["template"]["spec"];
    ["containers", "initContainers"]
        .iter()
        .flat_map(|list| spec[list].as_array().into_iter().flatten())
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// A container's environment as (name, value) in order; a variable taken from a Secret gives
/// `secret:<name>/<key>`.
pub fn env(container: &Value) -> Vec<(String, String)> {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let name = e["name"].as_str().unwrap().to_string();
            let value = match &e["valueFrom"]["secretKeyRef"] {
                Value::Null => e["value"].as_str().unwrap_or("").to_string(),
                r => format!(
                    "secret:{}/{}",
                    r["name"].as_str().unwrap(),
                    r["key"].as_str().unwrap()
                ),
            };
            (name, value)
        })
        .collect()
}

/// The environment as the kubelet hands it to the process: `$(NAME)` replaced by the value of
/// a variable defined before it; a Secret's key by `secrets(name, key)`.
pub fn expanded_env(container: &Value, secrets: impl Fn(&str) -> String) -> Vec<(String, String)> {
    let mut done: Vec<(String, String)> = Vec::new();
    for (name, value) in env(container) {
        let mut value = match value.strip_prefix("secret:") {
            Some(reference) => secrets(reference),
            None => value,
        };
        for (earlier, v) in &done {
            value = value.replace(&format!("$({earlier})"), v);
        }
        done.push((name, value));
    }
    done
}

/// A container's port number by name.
pub fn port(container: &Value, name: &str) -> u64 {
    container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("no port {name}"))
}

/// Every file under `dir`, by its path relative to it.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(
                files_under(&path)
                    .into_iter()
                    .map(|p| PathBuf::from(path.file_name().unwrap()).join(p)),
            );
        } else {
            out.push(PathBuf::from(path.file_name().unwrap()));
        }
    }
    out.sort();
    out
}
