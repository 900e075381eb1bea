#![doc = include_str!("../README.md")]
//!
//! # Layout
//!
//! - [`marker`]: the marker format written to the markers topic. Pure encode/decode, no I/O;
//!   specified byte by byte in `docs/markers.md`.
//! - [`client`]: the library a consumer links in. Hands records out as [`client::Delivery`]
//!   handles to ack, nack, reject or keep alive, and writes their markers.
//! - [`tracker`]: the RedeliveryTracker. A pure per-partition state driven
//!   by a markers consumer thread and a redelivery worker thread.
//! - [`events`]: delivery events (scheduled, delivered, acked, retried, ...) to subscribe to.
//! - [`failpoint`]: test-only crash, panic and failure points (feature `failpoints`).
//! - [`headers`]: the `kr-*` headers on redelivered and dead-lettered copies, the ranges of
//!   those a producer may set, and [`headers::HeaderName`]: header names are bytes.
//! - `cli` (feature `cli`): the `redelivery-tracker` binary's commands, admin server and demo.
//!
//! ARCHITECTURE.md explains how the parts fit and which invariants keep every message safe.
#![deny(unsafe_code)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod client;
pub mod events;
pub mod failpoint;
pub mod headers;
mod kafka;
mod log_limit;
pub mod marker;
mod resume;
pub mod tracker;

#[cfg(feature = "cli")]
pub mod cli;

/// The message of a caught panic, for the error that reports it.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}
