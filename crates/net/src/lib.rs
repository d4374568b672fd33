//! The atomos wire format, without I/O: what crosses a connection and how it is checked.
//!
//! - [`frame`]: length-prefixed frames with a configurable maximum size, decoded incrementally
//!   from whatever bytes arrive; a malformed stream is a typed error, never a panic.
//! - [`wire`]: every message travels in an envelope carrying the wire version, encoded with a
//!   compact binary codec (postcard); a frame decodes to a whole message or to an error, never
//!   to part of one.
//! - [`keys`]: every member and client has a static key pair of its own.
//! - [`roster`]: which keys a node admits, as which member or client.
//! - [`handshake`]: the sans-I/O state machine that opens every connection: wire version and
//!   cluster name, then a Noise `XXpsk0` handshake keyed by the cluster secret in which each
//!   side proves its own key, admitted by the [`roster`].
//! - [`secure`]: after the handshake every byte travels in records sealed with
//!   ChaCha20-Poly1305; a tampered, injected, replayed or reordered record does not open.
//!
//! On top, with I/O:
//!
//! - [`transport`]: the [`Transport`](transport::Transport) trait every transport implements,
//!   and fault rules (drop, delay, cut off) settable while it runs.
//! - [`tcp`]: TCP on tokio (one connection per pair, coalesced writes, re-dial with back-off,
//!   keep-alive and dead-peer detection).
//! - [`memory`]: in-memory links for clusters inside one process.
//! - [`rpc`]: requests with responses (futures with timeouts) and one-way messages.
//! - [`spin`]: whether spinning waits (busy polls) pay off, judged by the spinners themselves.

#![deny(missing_docs)]

mod counters;
pub mod frame;
pub mod handshake;
pub mod keys;
pub mod memory;
pub mod roster;
pub mod rpc;
pub mod secure;
pub mod spin;
pub mod tcp;
pub mod transport;
pub mod wire;
