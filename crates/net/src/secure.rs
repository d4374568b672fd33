//! Sealed records: once a connection's handshake is done, every byte on it travels inside a
//! record sealed with ChaCha20-Poly1305 (AEAD) under keys only the two ends hold.
//!
//! A record is a frame (see [`frame`](crate::frame)) whose payload is the ciphertext of at most
//! [`MAX_PLAIN`] bytes of the plaintext stream, with a 16-byte tag. Each direction numbers its
//! records from 0 and the number is the AEAD nonce, never sent: a record opens only at its own
//! place in the stream. So a flipped bit, an injected record, and a dropped, reordered or
//! replayed one all fail to open, and the connection must then be closed (an [`Opener`] that
//! failed stays failed).

use std::sync::Arc;

use snow::StatelessTransportState;

use crate::frame::PREFIX;

/// Largest record payload (ciphertext and tag): Noise's message limit.
pub const MAX_RECORD: usize = 65_535;

/// Bytes of the authentication tag in every record.
pub const TAG: usize = 16;

/// Largest plaintext one record carries.
pub const MAX_PLAIN: usize = MAX_RECORD - TAG;

/// Why a record could not be sealed or opened.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// The record was not sealed by the peer at this place in the stream: tampered with,
    /// injected, replayed, reordered, or after a dropped record.
    #[error("record {number} does not open: tampered with, injected, replayed or out of order")]
    Tampered {
        /// The record's place in the stream.
        number: u64,
    },
    /// A record longer than [`MAX_RECORD`] or shorter than a tag.
    #[error("record of {len} bytes is not a sealed record")]
    BadLength {
        /// Its length.
        len: usize,
    },
    /// 2^64 records went one way: the connection must be re-opened (never reached in practice).
    #[error("record numbers exhausted")]
    Exhausted,
}

/// Seals the plaintext one side sends. Records must go out in the order they are sealed.
pub struct Sealer {
    keys: Arc<StatelessTransportState>,
    next: u64,
}

/// Opens the records one side receives, in the order they arrive.
pub struct Opener {
    keys: Arc<StatelessTransportState>,
    next: u64,
    failed: Option<SealError>,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sealer {{ next: {} }}", self.next)
    }
}

impl std::fmt::Debug for Opener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Opener {{ next: {}, failed: {:?} }}",
            self.next, self.failed
        )
    }
}

/// The two halves of a connection's sealed channel, from a finished Noise handshake.
pub(crate) fn split(keys: StatelessTransportState) -> (Sealer, Opener) {
    let keys = Arc::new(keys);
    (
        Sealer {
            keys: keys.clone(),
            next: 0,
        },
        Opener {
            keys,
            next: 0,
            failed: None,
        },
    )
}

impl Sealer {
    /// Appends `plain` to `out` as sealed records (none for an empty `plain`). On error `out`
    /// is left as it was.
    pub fn seal(&mut self, plain: &[u8], out: &mut Vec<u8>) -> Result<(), SealError> {
        let start = out.len();
        for chunk in plain.chunks(MAX_PLAIN) {
            if let Err(e) = self.seal_record(chunk, out) {
                out.truncate(start);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Appends one record carrying `chunk` (at most [`MAX_PLAIN`] bytes; empty is allowed).
    pub fn seal_record(&mut self, chunk: &[u8], out: &mut Vec<u8>) -> Result<(), SealError> {
        if chunk.len() > MAX_PLAIN {
            return Err(SealError::BadLength {
                len: chunk.len() + TAG,
            });
        }
        if self.next == u64::MAX {
            return Err(SealError::Exhausted);
        }
        let start = out.len();
        let len = chunk.len() + TAG;
        out.resize(start + PREFIX + len, 0);
        match self
            .keys
            .write_message(self.next, chunk, &mut out[start + PREFIX..])
        {
            Ok(written) if written == len => {
                out[start..start + PREFIX].copy_from_slice(&(len as u32).to_be_bytes());
                self.next += 1;
                Ok(())
            }
            _ => {
                out.truncate(start);
                Err(SealError::BadLength { len })
            }
        }
    }
}

impl Opener {
    /// Opens one record (a frame's payload) and appends its plaintext to `out`. After an error
    /// every later record is refused too: the stream position is lost.
    pub fn open(&mut self, record: &[u8], out: &mut Vec<u8>) -> Result<(), SealError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let result = self.open_next(record, out);
        if let Err(e) = &result {
            self.failed = Some(e.clone());
        }
        result
    }

    fn open_next(&mut self, record: &[u8], out: &mut Vec<u8>) -> Result<(), SealError> {
        if record.len() < TAG || record.len() > MAX_RECORD {
            return Err(SealError::BadLength { len: record.len() });
        }
        if self.next == u64::MAX {
            return Err(SealError::Exhausted);
        }
        let start = out.len();
        out.resize(start + record.len() - TAG, 0);
        match self.keys.read_message(self.next, record, &mut out[start..]) {
            Ok(n) => {
                out.truncate(start + n);
                self.next += 1;
                Ok(())
            }
            Err(_) => {
                out.truncate(start);
                Err(SealError::Tampered { number: self.next })
            }
        }
    }
}
