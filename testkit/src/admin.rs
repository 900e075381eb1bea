//! A tracker's admin server, seen from outside: its address, read back from the file the
//! tracker writes once it has bound `--admin-listen 127.0.0.1:0` (so no port is picked before
//! it is bound: a port picked free and handed over can be taken meanwhile), plain HTTP GETs,
//! and waiting for `/readyz`.

use std::path::PathBuf;
use std::process::Child;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The admin address of a tracker process started with [`AdminAddr::args`].
pub struct AdminAddr {
    file: PathBuf,
    addr: OnceLock<String>,
}

impl AdminAddr {
    /// An address the tracker will write to a new file in `dir`.
    pub fn new_in(dir: &std::path::Path) -> Result<Self, crate::Error> {
        std::fs::create_dir_all(dir)?;
        Ok(AdminAddr {
            file: dir.join(format!("{:016x}.addr", rand::random::<u64>())),
            addr: OnceLock::new(),
        })
    }

    /// The tracker flags that bind port 0 and write the bound address.
    pub fn args(&self) -> [String; 4] {
        [
            "--admin-listen".into(),
            "127.0.0.1:0".into(),
            "--admin-address-file".into(),
            self.file.display().to_string(),
        ]
    }

    /// Waits up to `limit` for the tracker to write its address; fails at once if `child`
    /// (the tracker) exits first.
    pub fn wait(
        &self,
        mut child: Option<&mut Child>,
        limit: Duration,
    ) -> Result<&str, crate::Error> {
        if let Some(a) = self.addr.get() {
            return Ok(a);
        }
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(a) = std::fs::read_to_string(&self.file) {
                let _ = std::fs::remove_file(&self.file);
                return Ok(self.addr.get_or_init(|| a));
            }
            if let Some(c) = child.as_deref_mut() {
                if let Some(status) = c.try_wait()? {
                    return Err(format!("the tracker exited at start-up ({status})").into());
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "the tracker never wrote its admin address to {}",
                    self.file.display()
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl std::ops::Deref for AdminAddr {
    type Target = str;

    /// Waits (up to a minute) for the tracker to have bound its admin server. Panics if it
    /// never does: this is the test's assertion that the tracker started.
    fn deref(&self) -> &str {
        match self.wait(None, Duration::from_secs(60)) {
            Ok(a) => a,
            Err(e) => panic!("{e}"),
        }
    }
}

impl std::fmt::Display for AdminAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self)
    }
}

/// GETs `path` from an admin server; returns (status, body), or `None` if it did not answer.
pub fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    // HTTP/1.0, so the body comes back whole, never chunked.
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let status = buf.split(' ').nth(1)?.parse().ok()?;
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// Waits up to `limit` until the admin server at `addr` answers `/readyz` with 200; fails at
/// once if `child` (the tracker) exits first.
pub fn wait_ready(
    addr: &str,
    mut child: Option<&mut Child>,
    limit: Duration,
) -> Result<(), crate::Error> {
    let deadline = Instant::now() + limit;
    while http_get(addr, "/readyz").map(|r| r.0) != Some(200) {
        if let Some(c) = child.as_deref_mut() {
            if let Some(status) = c.try_wait()? {
                return Err(format!("the tracker exited before it was ready ({status})").into());
            }
        }
        if Instant::now() >= deadline {
            return Err(format!("the tracker at {addr} was not ready within {limit:?}").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_is_read_back_from_the_file() {
        let dir = std::env::temp_dir().join("testkit-admin");
        let a = AdminAddr::new_in(&dir).expect("dir");
        let file = a.args()[3].clone();
        std::fs::write(&file, "127.0.0.1:1234").expect("write");
        assert_eq!(
            a.wait(None, Duration::from_secs(1)).expect("read"),
            "127.0.0.1:1234"
        );
        assert_eq!(&*a, "127.0.0.1:1234", "remembered once the file is gone");
    }

    #[test]
    fn a_tracker_that_exits_is_reported_at_once() {
        let dir = std::env::temp_dir().join("testkit-admin");
        let a = AdminAddr::new_in(&dir).expect("dir");
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("true runs");
        let err = a
            .wait(Some(&mut child), Duration::from_secs(30))
            .unwrap_err();
        assert!(err.to_string().contains("exited"), "{err}");
    }

    #[test]
    fn an_admin_server_that_is_not_there_does_not_answer() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("bind")
            .port();
        assert_eq!(http_get(&format!("127.0.0.1:{port}"), "/readyz"), None);
    }
}
