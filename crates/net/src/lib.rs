//! The atomos wire format, without I/O: what crosses a connection and how it is checked.
//!
//! - [`frame`]: length-prefixed frames with a configurable maximum size, decoded incrementally
//!   from whatever bytes arrive; a malformed stream is a typed error, never a panic.
//! - [`wire`]: every message travels in an envelope carrying the wire version, encoded with a
//!   compact binary codec (postcard); a frame decodes to a whole message or to an error, never
//!   to part of one.
//! - [`handshake`]: the sans-I/O state machine that opens every connection: cluster name, node
//!   id, wire version and an HMAC-SHA256 proof over both sides' nonces with the cluster secret.
//!
//! Transports (TCP, in-memory, simulated) build on these in later work.

#![deny(missing_docs)]

pub mod frame;
pub mod handshake;
pub mod wire;
