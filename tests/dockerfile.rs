//! Static checks of docker/Dockerfile (no Docker engine here): pinned bases, a non-root user, a
//! health check on the admin endpoint, and every path it copies present in the repository.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

#[test]
fn dockerfile_is_pinned_non_root_healthchecked_and_copies_what_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("docker/Dockerfile")).unwrap();
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let froms: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with("FROM "))
        .copied()
        .collect();
    assert!(froms.len() >= 2, "multi-stage build expected");
    for from in &froms {
        let image = from.split_whitespace().nth(1).unwrap();
        let tag = image.split_once(':').map(|(_, t)| t).unwrap_or("");
        assert!(
            !tag.is_empty() && tag != "latest",
            "{from}: base image not pinned by tag"
        );
    }
    let user = lines
        .iter()
        .rev()
        .find(|l| l.starts_with("USER "))
        .expect("a USER line");
    assert!(
        !user.ends_with(" root") && !user.ends_with(" 0"),
        "runs as root: {user}"
    );
    assert!(
        text.contains("HEALTHCHECK") && text.contains("/healthz"),
        "no health check on /healthz"
    );
    for copy in lines
        .iter()
        .filter(|l| l.starts_with("COPY ") && !l.contains("--from="))
    {
        let parts: Vec<&str> = copy.split_whitespace().collect();
        for src in &parts[1..parts.len() - 1] {
            assert!(
                root.join(src).exists(),
                "{copy}: {src} is not in the repository"
            );
        }
    }
}
