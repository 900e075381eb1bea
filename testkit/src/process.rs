//! Child processes: killed when the test lets go of them, signalled as an orchestrator would,
//! and measured from `/proc`.

use std::process::{Child, Command};
use std::time::Duration;

/// A child process that is killed when dropped, so a failing test leaves nothing running
/// behind it.
pub struct ChildGuard(pub Child);

impl std::ops::Deref for ChildGuard {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for ChildGuard {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends signal `name` (`TERM`, `STOP`, `CONT`, `KILL`, ...) to process `pid` with `kill(1)`.
pub fn signal(pid: u32, name: &str) -> Result<(), crate::Error> {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("kill -{name} {pid} failed ({status})").into())
    }
}

/// Sends SIGTERM and waits up to `grace` for the process to exit; whether it did.
pub fn stop_within(child: &mut Child, grace: Duration) -> bool {
    if signal(child.id(), "TERM").is_err() {
        return false;
    }
    crate::wait::until(grace, Duration::from_millis(50), || {
        matches!(child.try_wait(), Ok(Some(_))).then_some(())
    })
    .is_some()
}

/// CPU seconds (user + system) process `pid` has used, from `/proc/<pid>/stat`; 0 if it is
/// gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The fields after the command name, which is in parentheses and may hold spaces.
    let after = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name; the kernel
    // counts them in USER_HZ, 100 on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

/// Resident set of process `pid` in bytes, from `/proc/<pid>/status`; 0 if it is gone.
pub fn resident_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_uses_memory_and_a_finished_one_none() {
        assert!(resident_bytes(std::process::id()) > 0);
        let mut child = Command::new("true").spawn().expect("true runs");
        let pid = child.id();
        child.wait().expect("true exits");
        assert_eq!(resident_bytes(pid), 0);
        assert_eq!(cpu_seconds(pid), 0.0);
    }

    #[test]
    fn a_stopped_child_is_ended_by_sigterm() {
        let mut child = Command::new("sleep").arg("60").spawn().expect("sleep runs");
        assert!(stop_within(&mut child, Duration::from_secs(10)));
    }
}
