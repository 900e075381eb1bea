//! The Helm chart (`deploy/helm/kafka-redelivery`), the plain manifests rendered from it
//! (`deploy/kubernetes`) and the sidecar example (`deploy/examples`), checked offline: this
//! machine has no cluster. Helm lints and renders; kubecheck (`deploy/kubecheck`) decodes every
//! object strictly into the Kubernetes API types of a pinned version and follows the references
//! between them; what the chart hands the tracker is checked against the binary's `--help`, and
//! then run: the rendered environment starts a real tracker whose probes answer where the chart
//! points them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;

mod render;
mod run;

use std::collections::BTreeSet;
use std::path::Path;

use kafka_redelivery::tracker::service::LONGEST_STOP;
use serde_json::Value;

use common::help::{help, help_flags, help_switches};
use common::{example_bin, repo, tracker_bin};
use render::*;

/// Settings of `run --help` the chart does not set, and why.
const NOT_IN_THE_CHART: [(&str, &str); 1] = [(
    "REDELIVERY_ADMIN_ADDRESS_FILE",
    "for --admin-listen port 0, which a probe cannot follow",
)];

fn kinds(objects: &[Value]) -> BTreeSet<String> {
    objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_chart_lints_and_renders_strictly_with_its_defaults_and_with_every_option_on() {
    let chart = repo(CHART).display().to_string();
    let all_on = repo(ALL_ON).display().to_string();
    kube_tools_ok(&[
        "helm",
        "lint",
        "--strict",
        &chart,
        "--set",
        "tracker.markersTopic=m",
    ]);
    kube_tools_ok(&["helm", "lint", "--strict", &chart, "-f", &all_on]);

    let defaults = render_default(&[]);
    let expected = [
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
    ];
    assert_eq!(kinds(&defaults), expected.map(String::from).into());
    let every = render_all_on(&[]);
    let mut expected: BTreeSet<String> = expected.map(String::from).into();
    expected.extend(
        [
            "ConfigMap",
            "Job",
            "PodMonitor",
            "PrometheusRule",
            "ServiceMonitor",
        ]
        .map(String::from),
    );
    assert_eq!(kinds(&every), expected);
}

#[test]
fn the_strict_decoder_refuses_what_an_api_server_would_and_references_to_nothing() {
    let rendered =
        String::from_utf8(helm_template(&["--set", "tracker.markersTopic=m"]).stdout).unwrap();
    assert!(try_decode(&rendered).is_ok());
    let refused = [
        // A misspelt field: the API server would reject it (or drop it, without strictness).
        (
            "readOnlyRootFilesystem",
            "readOnlyRootFilesytem",
            "unknown field",
        ),
        // A kind this API version does not have.
        (
            "apiVersion: policy/v1",
            "apiVersion: policy/v1beta2",
            "unknown kind",
        ),
        // A probe on a port the container does not declare.
        (
            "port: admin\n            periodSeconds: 10",
            "port: metrics\n            periodSeconds: 10",
            "does not declare",
        ),
        // A Service whose selector finds no pod.
        (
            "  selector:\n    app.kubernetes.io/name",
            "  selector:\n    app.kubernetes.io/nam",
            "matches no pod",
        ),
    ];
    for (from, to, message) in refused {
        assert!(
            rendered.contains(from),
            "{from:?} is not in the rendered chart"
        );
        let broken = rendered.replacen(from, to, 1);
        let error = try_decode(&broken).expect_err(&format!("{to:?} was accepted"));
        assert!(error.contains(message), "{to:?}: {error}");
    }
    // A $(NAME) reference before NAME is defined reaches the process as it is written.
    let early = rendered.replacen(
        "- name: REDELIVERY_LOG_FORMAT\n              value: \"json\"",
        "- name: REDELIVERY_LOG_FORMAT\n              value: \"$(RUST_LOG)\"",
        1,
    );
    assert!(try_decode(&early)
        .unwrap_err()
        .contains("not defined before it"));
}

#[test]
fn values_the_chart_does_not_know_or_cannot_use_are_refused_with_their_name() {
    let cases: [(&[&str], &str); 5] = [
        (
            &[
                "--set",
                "tracker.markersTopic=m",
                "--set",
                "tracker.maxDelivery=3",
            ],
            "maxDelivery",
        ),
        (
            &[
                "--set",
                "tracker.markersTopic=m",
                "--set",
                "tracker.maxDeliveries=9000",
            ],
            "maxDeliveries",
        ),
        (&[], "tracker.markersTopic is required"),
        (
            &[
                "--set",
                "tracker.markersTopic=m",
                "--set",
                "kafka.sasl.mechanism=SCRAM-SHA-512",
            ],
            "kafka.sasl.existingSecret is required",
        ),
        (
            &[
                "--set",
                "tracker.markersTopic=m",
                "--set",
                "kafka.settings.client\\.id=a;b",
            ],
            "cannot contain ';'",
        ),
    ];
    for (args, message) in cases {
        let out = helm_template(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
}

#[test]
fn the_tracker_and_the_topics_job_read_every_setting_the_chart_gives_them() {
    let objects = render_all_on(&[]);
    let run_help = help(Path::new(tracker_bin()), &["run"]);
    let run_env: BTreeSet<String> = help_flags(&run_help).into_iter().map(|(_, e)| e).collect();
    let tracker = container(one(&objects, "Deployment"), "tracker");
    assert_eq!(tracker["args"], serde_json::json!(["run"]));
    let given = env(tracker);
    let referenced = given.iter().map(|(_, v)| v.clone()).collect::<String>();
    for (name, _) in &given {
        let ours = name.starts_with("REDELIVERY_");
        assert!(
            !ours || run_env.contains(name),
            "the chart sets {name}, which `run` does not read"
        );
        // Anything else is the log filter, a credential the settings refer to, or extraEnv.
        assert!(
            ours || name == "RUST_LOG"
                || name == "TZ"
                || referenced.contains(&format!("$({name})")),
            "the chart sets {name} for no reader"
        );
    }
    // Every setting of `run` is a value of the chart, or is left out on purpose.
    for name in &run_env {
        let skipped = NOT_IN_THE_CHART.iter().any(|(n, _)| n == name);
        assert!(
            skipped || given.iter().any(|(n, _)| n == name),
            "`run` reads {name}, which the chart never sets: add a value for it"
        );
    }

    let topics_help = help(Path::new(tracker_bin()), &["topics", "create"]);
    let topics_env: BTreeSet<String> = help_flags(&topics_help)
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    let job = container(one(&objects, "Job"), "topics");
    let args: Vec<&str> = job["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[..2], ["topics", "create"]);
    let switches = help_switches(&topics_help);
    for flag in args.iter().filter(|a| a.starts_with("--")) {
        assert!(
            switches.contains(*flag),
            "the topics Job passes {flag}, unknown to `topics create`"
        );
    }
    assert!(args.contains(&"orders,payments"), "{args:?}");
    for (name, _) in env(job) {
        assert!(
            topics_env.contains(&name) || name.starts_with("KAFKA_SASL_"),
            "the topics Job sets {name}, which `topics create` does not read"
        );
    }
}

#[test]
fn probes_ports_and_scrapes_point_at_the_admin_server() {
    for objects in [render_default(&[]), render_all_on(&[])] {
        let tracker = container(one(&objects, "Deployment"), "tracker");
        let admin = port(tracker, "admin");
        let listen = env(tracker)
            .into_iter()
            .find(|(n, _)| n == "REDELIVERY_ADMIN_LISTEN")
            .unwrap()
            .1;
        assert_eq!(listen, format!("0.0.0.0:{admin}"));
        assert_eq!(tracker["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(tracker["readinessProbe"]["httpGet"]["path"], "/readyz");
        for probe in ["livenessProbe", "readinessProbe"] {
            assert_eq!(tracker[probe]["httpGet"]["port"], "admin");
        }
        let service = one(&objects, "Service");
        assert_eq!(service["spec"]["ports"][0]["port"], admin);
        assert_eq!(service["spec"]["ports"][0]["targetPort"], "admin");
        assert_eq!(service["spec"]["publishNotReadyAddresses"], true);
        for monitor in of_kind(&objects, "ServiceMonitor") {
            assert_eq!(monitor["spec"]["endpoints"][0]["port"], "admin");
            assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
        }
        for monitor in of_kind(&objects, "PodMonitor") {
            assert_eq!(monitor["spec"]["podMetricsEndpoints"][0]["port"], "admin");
            assert_eq!(
                monitor["spec"]["podMetricsEndpoints"][0]["path"],
                "/metrics"
            );
        }
    }
}

#[test]
fn the_prometheus_rule_and_the_dashboard_are_the_files_the_other_tests_check() {
    let objects = render_all_on(&[]);
    // docker/alerts.yml is what `promtool test rules` runs (tests/operations.rs).
    let rule = one(&objects, "PrometheusRule");
    assert_eq!(rule["spec"], yaml_file("docker/alerts.yml"));
    assert_eq!(rule["metadata"]["labels"]["release"], "prometheus");
    let map = one(&objects, "ConfigMap");
    let dashboard: Value =
        serde_json::from_str(map["data"]["kafka-redelivery.json"].as_str().unwrap()).unwrap();
    let file = std::fs::read_to_string(repo("grafana/dashboards/kafka-redelivery.json")).unwrap();
    assert_eq!(dashboard, serde_json::from_str::<Value>(&file).unwrap());
    assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(map["metadata"]["annotations"]["grafana_folder"], "Kafka");
}

#[test]
fn pods_run_locked_down_spread_over_nodes_and_stop_within_the_grace_period() {
    let defaults = render_default(&[]);
    let deployment = one(&defaults, "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let tracker = container(deployment, "tracker");
    let security = &tracker["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert!(
        pod["terminationGracePeriodSeconds"].as_u64().unwrap() > LONGEST_STOP.as_secs(),
        "the grace period must outlast the tracker's longest stop ({LONGEST_STOP:?})"
    );
    // A node drain never takes both replicas: one per node, and a budget of one.
    assert_eq!(deployment["spec"]["replicas"], 2);
    let term =
        &pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(term["topologyKey"], "kubernetes.io/hostname");
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (k, v) in term["labelSelector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&pod_labels[k], v);
    }
    let budget = one(&defaults, "PodDisruptionBudget");
    assert_eq!(budget["spec"]["minAvailable"], 1);
    assert_eq!(
        deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"],
        0
    );
    // One replica: no budget (it would block every drain).
    assert!(of_kind(
        &render_default(&["--set", "replicaCount=1"]),
        "PodDisruptionBudget"
    )
    .is_empty());
    let every = render_all_on(&[]);
    let pod = &one(&every, "Deployment")["spec"]["template"]["spec"];
    assert!(
        pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
            .is_array()
    );
    assert_eq!(pod["terminationGracePeriodSeconds"], 45);
}

#[test]
fn credentials_are_referenced_from_their_secret_and_never_written_into_an_object() {
    let objects = render_all_on(&[]);
    assert!(of_kind(&objects, "Secret").is_empty());
    for (workload, name) in [
        (one(&objects, "Deployment"), "tracker"),
        (one(&objects, "Job"), "topics"),
    ] {
        let c = container(workload, name);
        let given = env(c);
        let value = |n: &str| {
            given
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.clone())
                .unwrap()
        };
        assert_eq!(value("KAFKA_SASL_USERNAME"), "secret:tracker-sasl/username");
        assert_eq!(value("KAFKA_SASL_PASSWORD"), "secret:tracker-sasl/password");
        let settings = value("REDELIVERY_RDKAFKA");
        assert!(
            settings.contains("sasl.password=$(KAFKA_SASL_PASSWORD)"),
            "{settings}"
        );
        assert!(
            settings.contains("sasl.mechanism=SCRAM-SHA-512"),
            "{settings}"
        );
        assert!(
            settings.contains("ssl.ca.location=/etc/kafka-redelivery/tls/ca.crt"),
            "{settings}"
        );
        // What the process gets once the kubelet has expanded the references.
        let expanded = expanded_env(c, |r| format!("<{r}>"));
        let rdkafka = &expanded
            .iter()
            .find(|(k, _)| k == "REDELIVERY_RDKAFKA")
            .unwrap()
            .1;
        assert!(
            rdkafka.contains("sasl.password=<tracker-sasl/password>"),
            "{rdkafka}"
        );
        // The CA comes from its Secret, mounted read-only.
        assert_eq!(c["volumeMounts"][0]["readOnly"], true);
        let volumes = &workload["spec"]["template"]["spec"]["volumes"];
        assert_eq!(volumes[0]["secret"]["secretName"], "kafka-ca");
    }
}

#[test]
fn memory_requests_follow_the_formula_in_values_yaml() {
    let memory = |objects: &[Value]| {
        let r = &container(one(objects, "Deployment"), "tracker")["resources"];
        (
            r["requests"]["memory"].clone(),
            r["limits"]["memory"].clone(),
        )
    };
    // baseMiB + inFlight * bytesPerInFlight / 2^20, rounded up; the limit twice that.
    let mib = |in_flight: u64| 96 + (in_flight * 64).div_ceil(1 << 20);
    for (args, in_flight) in [
        (vec![], 1_000_000),
        (vec!["--set", "sizing.inFlight=10000000"], 10_000_000),
    ] {
        let m = mib(in_flight);
        assert_eq!(
            memory(&render_default(&args)),
            (
                Value::from(format!("{m}Mi")),
                Value::from(format!("{}Mi", 2 * m))
            )
        );
    }
    // Explicit resources replace the computed ones.
    assert_eq!(memory(&render_all_on(&[])), ("512Mi".into(), "1Gi".into()));
}

#[test]
fn the_plain_manifests_are_the_chart_rendered_and_build_with_kustomize() {
    let dir = tempfile::tempdir().unwrap();
    kube_tools_ok(&["render", &dir.path().display().to_string()]);
    let committed = repo("deploy/kubernetes");
    let generated = files_under(dir.path());
    for file in &generated {
        let fresh = std::fs::read_to_string(dir.path().join(file)).unwrap();
        let kept = std::fs::read_to_string(committed.join(file)).unwrap_or_default();
        assert!(
            fresh == kept,
            "deploy/kubernetes/{} is out of date: run scripts/kube-tools render",
            file.display()
        );
    }
    // Each kustomization lists exactly the manifests beside it.
    for sub in ["", "monitoring"] {
        let listed: BTreeSet<String> =
            yaml_file(&format!("deploy/kubernetes/{sub}/kustomization.yaml"))["resources"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_str().unwrap().to_string())
                .collect();
        let beside: BTreeSet<String> = generated
            .iter()
            .filter(|f| f.parent().unwrap() == Path::new(sub))
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(listed, beside, "deploy/kubernetes/{sub}/kustomization.yaml");
    }
    let base = kube_tools_ok(&["kubecheck", "kustomize", &committed.display().to_string()]);
    let monitoring = kube_tools_ok(&[
        "kubecheck",
        "kustomize",
        &committed.join("monitoring").display().to_string(),
    ]);
    let objects = decode_text(&format!("{base}\n---\n{monitoring}"));
    assert_eq!(of_kind(&objects, "Deployment").len(), 1);
    assert_eq!(of_kind(&objects, "ServiceMonitor").len(), 1);
    for o in &objects {
        assert!(o["metadata"]["labels"]
            .get("app.kubernetes.io/managed-by")
            .is_none());
    }
}

#[test]
fn the_chart_readme_documents_every_value_with_its_default() {
    let table = kube_tools_ok(&[
        "kubecheck",
        "values-table",
        &repo(CHART).join("values.yaml").display().to_string(),
    ]);
    let readme = std::fs::read_to_string(repo(CHART).join("README.md")).unwrap();
    assert!(
        readme.contains(&format!(
            "<!-- values-table -->\n{table}<!-- end values-table -->"
        )),
        "the values table of {CHART}/README.md is out of date: run scripts/kube-tools render"
    );
    // The table cannot leave a value out: an undocumented one is an error.
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    std::fs::write(&values, "# -- documented\na: 1\nb: 2\n").unwrap();
    let out = kube_tools(&["kubecheck", "values-table", &values.display().to_string()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("b (line 3) has no"));
}

#[test]
fn the_sidecar_example_decodes_and_both_containers_read_what_they_are_given() {
    let objects = decode_files(&[&repo("deploy/examples/worker-with-tracker-sidecar.yaml")]);
    let deployment = one(&objects, "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    assert!(pod["terminationGracePeriodSeconds"].as_u64().unwrap() > LONGEST_STOP.as_secs());
    // A native sidecar: an init container that keeps running.
    let tracker = container(deployment, "tracker");
    assert_eq!(pod["initContainers"][0]["name"], "tracker");
    assert_eq!(tracker["restartPolicy"], "Always");
    assert_eq!(tracker["args"], serde_json::json!(["run"]));
    let run_env: BTreeSet<String> = help_flags(&help(Path::new(tracker_bin()), &["run"]))
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    for (name, _) in env(tracker) {
        assert!(
            run_env.contains(&name),
            "the sidecar sets {name}, which `run` does not read"
        );
    }
    assert_eq!(tracker["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(tracker["readinessProbe"]["httpGet"]["path"], "/readyz");
    let listen = env(tracker)
        .into_iter()
        .find(|(n, _)| n == "REDELIVERY_ADMIN_LISTEN")
        .unwrap()
        .1;
    assert_eq!(listen, format!("0.0.0.0:{}", port(tracker, "admin")));

    let worker = container(deployment, "worker");
    assert_eq!(worker["command"], serde_json::json!(["example-worker"]));
    let worker_help = help(&example_bin("worker"), &[]);
    let switches = help_switches(&worker_help);
    for arg in worker["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
    {
        assert!(
            !arg.starts_with("--") || switches.contains(arg),
            "the worker is passed {arg}"
        );
    }
    let worker_env: BTreeSet<String> = help_flags(&worker_help)
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    for (name, _) in env(worker) {
        assert!(
            worker_env.contains(&name),
            "the worker is given {name}, which it does not read"
        );
    }
}

#[test]
fn the_example_overlay_points_the_plain_manifests_at_a_cluster() {
    let dir = repo("deploy/examples/kustomize-overlay")
        .display()
        .to_string();
    let objects = decode_text(&kube_tools_ok(&["kubecheck", "kustomize", &dir]));
    assert!(objects
        .iter()
        .all(|o| o["metadata"]["namespace"] == "orders"));
    let tracker = container(one(&objects, "Deployment"), "tracker");
    assert_eq!(
        tracker["image"],
        "registry.example.com/kafka-redelivery:0.1.0"
    );
    let given = env(tracker);
    assert_eq!(
        given[0],
        (
            "REDELIVERY_BROKERS".into(),
            "kafka-0.kafka:9092,kafka-1.kafka:9092".into()
        )
    );
    assert_eq!(
        given[1],
        ("REDELIVERY_MARKERS_TOPIC".into(), "orders.markers".into())
    );
    assert_eq!(of_kind(&objects, "PrometheusRule").len(), 1);
}

#[test]
fn numbers_from_a_values_file_reach_the_tracker_as_digits() {
    // Helm reads a values file's numbers as floats, which print as 1e+07 unless the chart
    // says otherwise; the tracker would refuse that and never start.
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    std::fs::write(
        &values,
        "tracker:\n  markersTopic: m\n  snapshotAfterMarkers: 10000000\n\
         kafka:\n  settings:\n    queued.max.messages.kbytes: 2000000\n    x.ratio: 0.5\n\
         topics:\n  create: true\n  partitions: 1000000\nterminationGracePeriodSeconds: 1000000\n",
    )
    .unwrap();
    let objects = render(&["-f", &values.display().to_string()]);
    let given = env(container(one(&objects, "Deployment"), "tracker"));
    let value = |n: &str| given.iter().find(|(k, _)| k == n).unwrap().1.clone();
    assert_eq!(value("REDELIVERY_SNAPSHOT_AFTER_MARKERS"), "10000000");
    assert_eq!(
        value("REDELIVERY_RDKAFKA"),
        "queued.max.messages.kbytes=2000000;x.ratio=0.5"
    );
    let job = container(one(&objects, "Job"), "topics");
    assert!(job["args"].as_array().unwrap().contains(&"1000000".into()));
    let pod = &one(&objects, "Deployment")["spec"]["template"]["spec"];
    assert_eq!(pod["terminationGracePeriodSeconds"], 1_000_000);
}
