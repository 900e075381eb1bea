//! Binaries cargo built next to the running one: a test binary lives in `target/<profile>/deps`,
//! an example in `target/<profile>/examples`, and the crate's binaries in `target/<profile>`.

use std::path::PathBuf;

/// `target/<profile>`, found from the running executable.
pub fn target_dir() -> Result<PathBuf, crate::Error> {
    let me = std::env::current_exe()?;
    let dir = me.parent().ok_or("the running executable has no folder")?;
    let dir = match dir.file_name().and_then(|n| n.to_str()) {
        Some("deps" | "examples") => dir.parent().ok_or("no target directory")?,
        _ => dir,
    };
    Ok(dir.to_path_buf())
}

/// The crate binary `name` in `target/<profile>`, or an error saying how to build it.
pub fn binary(name: &str) -> Result<PathBuf, crate::Error> {
    let path = target_dir()?.join(name);
    if path.exists() {
        Ok(path)
    } else {
        Err(format!(
            "{} is missing: build it with `cargo build --all-features --bins`",
            path.display()
        )
        .into())
    }
}
