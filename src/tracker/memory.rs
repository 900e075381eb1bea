//! Giving freed memory back to the system after a replay.
//!
//! A takeover (or a restart, or a broker coming back) replays markers: librdkafka prefetches
//! them into its queue, tens of MiB of small allocations made on its broker threads, and frees
//! them as the tracker applies them. glibc keeps such memory in the arena that served it for
//! the next allocation rather than returning it, and the live allocations left in between
//! stop it from trimming the top of the heap. So the resident size stepped up by about 10 MiB
//! at every takeover while the live heap stayed at a few MiB (the one-hour soak in
//! RELIABILITY.md: 16 to 78 MiB over six takeovers; heaptrack on a tracker through five
//! takeovers and broker restarts: 2.8 MiB live, 44 MiB at a replay's peak, almost all of it
//! librdkafka's fetched messages; `malloc_trim(0)` called in that process from gdb took its
//! resident size from 77 to 40 MiB, heaptrack's own included).
//!
//! The cure is [`give_back`] (glibc's `malloc_trim(0)`, which releases the whole free pages of
//! every arena), called when the tracker has just caught up and every [`TRIM_EVERY`] after
//! that: a replay's memory goes back once the replay is over, and what a burst of
//! redeliveries frees goes back within half a minute. Pages only partly freed stay: in the
//! second soak each broker restart still left a few MiB more resident with the live heap
//! flat (RELIABILITY.md, "Soak"). A trim
//! walks the free chunks and hands each free run of pages back: 25 ms for a 128 MiB arena cut
//! into 2,048 runs (the unit test prints it), so it runs on a blocking thread, never on the
//! markers or redelivery threads. With another C library the call is compiled out.
//!
//! What the trim could not give back, [`limit_arenas`] stops from piling up. glibc gives each
//! thread that allocates under contention an arena of its own, up to eight per core, and
//! librdkafka runs a thread per broker connection: a broker restart had every one of them
//! refill its buffers, each in whatever arena it held, leaving partly used pages behind in
//! many arenas. With two arenas the same ten-minute soak with a broker restart every 50 s
//! (RELIABILITY.md, "Soak") ended at the tracker's starting level (17 against 15 MiB, where
//! eight arenas per core rose from 22.7 to 45.0 MiB between restarts).

use std::time::Duration;

use tokio::sync::watch;

/// How often freed memory is given back in steady state.
pub(crate) const TRIM_EVERY: Duration = Duration::from_secs(30);

/// Below this a trim is not worth a log line.
const WORTH_LOGGING: u64 = 1 << 20;

/// This process's resident memory in bytes, from `/proc/self/status` (`None` where there is no
/// such file).
pub(crate) fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Returns the allocator's whole free pages to the system; the resident size before and after
/// (`None` where it cannot be read).
pub(crate) fn give_back() -> (Option<u64>, Option<u64>) {
    let before = resident_bytes();
    trim();
    (before, resident_bytes())
}

// This file holds one of the three places this crate uses `unsafe` (the others read raw
// header bytes, headers/raw.rs, and wait on a producer's queue, kafka/producer.rs): calls into the C library that no safe crate wraps, here and in
// `set_arena_max`.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn trim() {
    // SAFETY: malloc_trim takes no pointers and only rearranges the allocator's own free
    // lists under its arena locks; it is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

/// The arenas glibc may create unless `MALLOC_ARENA_MAX` says otherwise (see the module
/// docs). Two, not one: the markers loop and the redelivery worker allocate at the same time.
const ARENAS: i32 = 2;

/// Caps glibc's malloc arenas at [`ARENAS`], unless the environment already sets
/// `MALLOC_ARENA_MAX` (an operator's choice wins). Called first thing in `main`, before any
/// thread exists, since arenas once made are never merged.
pub(crate) fn limit_arenas() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        set_arena_max(ARENAS);
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn set_arena_max(arenas: i32) {
    // SAFETY: mallopt takes two integers and only changes the allocator's tuning; glibc
    // applies M_ARENA_MAX under its own lock, so it is safe at any time.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, arenas);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_arena_max(_: i32) {}

/// Gives freed memory back each time the tracker becomes ready (a replay just ended) and every
/// [`TRIM_EVERY`]; runs until dropped. Each trim runs on the blocking pool (it can take tens of
/// milliseconds, see the module docs); they are 30 s apart, so they never pile up.
pub(crate) async fn give_back_after_replays(ready: watch::Receiver<bool>) {
    trim_on(ready, || {
        tokio::task::spawn_blocking(|| {
            let took = std::time::Instant::now();
            let (before, after) = give_back();
            if let (Some(b), Some(a)) = (before, after) {
                if b.saturating_sub(a) >= WORTH_LOGGING {
                    tracing::debug!(
                        before_mib = b >> 20,
                        after_mib = a >> 20,
                        took_ms = took.elapsed().as_millis() as u64,
                        "freed memory given back to the system"
                    );
                }
            }
        });
    })
    .await
}

/// The schedule of [`give_back_after_replays`], with the trim itself passed in.
async fn trim_on(mut ready: watch::Receiver<bool>, mut trim: impl FnMut()) {
    let mut open = true;
    loop {
        if open {
            match tokio::time::timeout(TRIM_EVERY, ready.changed()).await {
                // Became unready: a replay starts; trim when it ends.
                Ok(Ok(())) if !*ready.borrow_and_update() => continue,
                // The tracker is going away: keep to the period alone.
                Ok(Err(_)) => open = false,
                _ => {}
            }
        } else {
            tokio::time::sleep(TRIM_EVERY).await;
        }
        trim();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a replay leaves behind: many small blocks freed, a few kept alive between them,
    /// all in the arena of a thread that has gone.
    fn fragment(total: usize, block: usize, keep_every: usize) -> Vec<Vec<u8>> {
        std::thread::spawn(move || {
            let blocks: Vec<Vec<u8>> = (0..total / block).map(|i| vec![i as u8; block]).collect();
            blocks.into_iter().step_by(keep_every).collect()
        })
        .join()
        .expect("allocating thread")
    }

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn memory_freed_between_live_blocks_is_given_back() {
        let kept = fragment(128 << 20, 4096, 64);
        let took = std::time::Instant::now();
        let (before, after) = give_back();
        eprintln!(
            "trim of a 128 MiB fragmented arena took {:?}",
            took.elapsed()
        );
        let (before, after) = (before.expect("VmRSS"), after.expect("VmRSS"));
        // 126 of the 128 MiB are free but held; at least half of them must go back.
        assert!(
            before.saturating_sub(after) >= 64 << 20,
            "resident {} MiB before, {} MiB after",
            before >> 20,
            after >> 20
        );
        assert_eq!(kept.len(), (128 << 20) / 4096 / 64);
    }

    #[test]
    fn resident_size_is_read() {
        assert!(resident_bytes().is_some_and(|b| b > 0));
    }

    #[tokio::test(start_paused = true)]
    async fn it_trims_when_the_tracker_becomes_ready_and_every_period() {
        let trims = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = || trims.load(std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn({
            let trims = trims.clone();
            trim_on(rx, move || {
                trims.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            })
        });
        let second = Duration::from_secs(1);
        tokio::time::sleep(second).await;
        assert_eq!(count(), 0, "nothing to give back before a replay ended");
        tx.send(true).expect("receiver alive");
        tokio::time::sleep(second).await;
        assert_eq!(count(), 1, "a trim as soon as it is ready");
        tx.send(false).expect("receiver alive");
        tokio::time::sleep(second).await;
        assert_eq!(count(), 1, "none when a replay starts");
        tokio::time::sleep(TRIM_EVERY).await;
        assert_eq!(count(), 2, "and one a period after the last change");
        tokio::time::sleep(TRIM_EVERY * 2).await;
        assert_eq!(count(), 4);
        drop(tx);
        tokio::time::sleep(TRIM_EVERY * 2 + second).await;
        assert!(
            count() >= 5,
            "a tracker going away still trims: {}",
            count()
        );
        task.abort();
    }
}
