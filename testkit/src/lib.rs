//! Helpers shared by kafka-redelivery's tests, examples and benchmark suite, so that each is
//! written once. Dev-only: nothing here ships with the library.
//!
//! # Layout
//!
//! - [`names`]: names no other test or run uses.
//! - [`clock`]: wall-clock milliseconds, as marker and record timestamps count them.
//! - [`process`]: child processes (killed on drop, signalled, stopped within a grace period)
//!   and their CPU and memory from `/proc`.
//! - [`admin`]: a tracker's admin server: its address read back from
//!   `--admin-address-file`, plain HTTP GETs, waiting for `/readyz`.
//! - [`metrics`]: reading figures out of the Prometheus text format.
//! - [`kafka`]: creating and deleting topics.
//! - [`wait`]: waiting on a condition instead of sleeping for a guessed time.
//! - [`bins`]: binaries cargo built next to the running one.
//! - [`fonts`]: a font for plot labels.
//!
//! Functions here return errors (or `Option`) rather than panicking, so the benchmark suite
//! can report them; tests turn them into assertions.
#![forbid(unsafe_code)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod admin;
pub mod bins;
pub mod clock;
pub mod fonts;
pub mod kafka;
pub mod metrics;
pub mod names;
pub mod process;
pub mod wait;

/// Errors of the kit: a message saying what could not be done.
pub type Error = Box<dyn std::error::Error + Send + Sync>;
