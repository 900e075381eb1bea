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
    stat_cpu_seconds(&format!("/proc/{pid}/stat"))
}

/// CPU seconds used so far by those threads of process `pid` whose name starts with one of
/// `prefixes`, threads that have exited not counted; 0 if the process is gone. The benchmarks
/// use it to show how much of a JVM broker's CPU went to compiling its own code (threads
/// `C1 CompilerThre...` and `C2 CompilerThre...`), work a long-running broker did long ago.
pub fn thread_cpu_seconds(pid: u32, prefixes: &[&str]) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    tasks
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|name| prefixes.iter().any(|p| name.starts_with(p)))
        })
        .map(|task| stat_cpu_seconds(&task.path().join("stat").to_string_lossy()))
        .sum()
}

/// utime + stime of a `/proc/.../stat` file in seconds; 0 if it cannot be read.
fn stat_cpu_seconds(path: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(path) else {
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
    fn thread_cpu_is_counted_for_the_named_threads_only() {
        let me = std::process::id();
        // A thread that spins until the kernel has charged it a tick: the loop ending is the
        // proof that its name is found and its CPU read.
        let spun = std::thread::Builder::new()
            .name("cpu-probe".into())
            .spawn(move || {
                let mut x = 0u64;
                while thread_cpu_seconds(me, &["cpu-probe"]) == 0.0 {
                    for i in 0..100_000u64 {
                        x = std::hint::black_box(x.wrapping_add(i));
                    }
                }
                thread_cpu_seconds(me, &["cpu-probe"])
            })
            .expect("thread starts")
            .join()
            .expect("thread ends");
        assert!(spun > 0.0);
        assert_eq!(thread_cpu_seconds(me, &["no-such-thread"]), 0.0);
        assert_eq!(thread_cpu_seconds(u32::MAX, &["cpu-probe"]), 0.0);
    }

    #[test]
    fn a_stopped_child_is_ended_by_sigterm() {
        let mut child = Command::new("sleep").arg("60").spawn().expect("sleep runs");
        assert!(stop_within(&mut child, Duration::from_secs(10)));
    }
}
