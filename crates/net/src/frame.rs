//! Length-prefixed frames: a 4-byte big-endian length, then that many bytes of payload.

/// Bytes of the length prefix.
pub const PREFIX: usize = 4;

/// The default largest payload a connection accepts (16 MiB).
pub const DEFAULT_MAX_FRAME: usize = 16 << 20;

/// Why a byte stream is not a valid sequence of frames.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A frame announces more bytes than the connection accepts.
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    Oversized {
        /// The announced length.
        len: usize,
        /// The configured maximum.
        max: usize,
    },
    /// The stream ended inside a frame.
    #[error("stream ended inside a frame ({buffered} bytes of an unfinished frame)")]
    Truncated {
        /// Bytes buffered of the unfinished frame.
        buffered: usize,
    },
}

/// Appends `payload` as one frame to `out`.
pub fn encode(payload: &[u8], max_frame: usize, out: &mut Vec<u8>) -> Result<(), FrameError> {
    if payload.len() > max_frame || payload.len() > u32::MAX as usize {
        return Err(FrameError::Oversized {
            len: payload.len(),
            max: max_frame,
        });
    }
    out.reserve(PREFIX + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    Ok(())
}

/// Splits an incoming byte stream into frames, whatever sizes the pieces arrive in.
///
/// After an error the decoder is poisoned: the connection must be closed, since the stream
/// position is lost.
#[derive(Debug)]
pub struct Decoder {
    max_frame: usize,
    buf: Vec<u8>,
    /// Start of the unread bytes in `buf`.
    start: usize,
    poisoned: Option<FrameError>,
}

impl Decoder {
    /// A decoder that refuses frames larger than `max_frame` bytes.
    pub fn new(max_frame: usize) -> Decoder {
        Decoder {
            max_frame,
            buf: Vec::new(),
            start: 0,
            poisoned: None,
        }
    }

    /// Changes the largest frame accepted from now on (a connection allows larger frames once
    /// its peer is authenticated).
    pub fn set_max_frame(&mut self, max_frame: usize) {
        self.max_frame = max_frame;
    }

    /// Adds bytes received from the peer.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.poisoned.is_some() {
            return;
        }
        // Drop consumed bytes before growing, so the buffer stays as small as one frame.
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame's payload, `Ok(None)` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<&[u8]>, FrameError> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        let avail = &self.buf[self.start..];
        if avail.len() < PREFIX {
            return Ok(None);
        }
        let len = u32::from_be_bytes([avail[0], avail[1], avail[2], avail[3]]) as usize;
        if len > self.max_frame {
            let e = FrameError::Oversized {
                len,
                max: self.max_frame,
            };
            self.poisoned = Some(e.clone());
            return Err(e);
        }
        if avail.len() < PREFIX + len {
            return Ok(None);
        }
        let from = self.start + PREFIX;
        self.start = from + len;
        Ok(Some(&self.buf[from..from + len]))
    }

    /// Called when the peer closed the stream: an error if it stopped inside a frame.
    pub fn finish(&self) -> Result<(), FrameError> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        match self.buf.len() - self.start {
            0 => Ok(()),
            buffered => Err(FrameError::Truncated { buffered }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_survive_any_split() {
        let mut stream = Vec::new();
        for p in [&b"one"[..], b"", b"three!!"] {
            encode(p, 64, &mut stream).unwrap();
        }
        for chunk in 1..stream.len() {
            let mut d = Decoder::new(64);
            let mut got: Vec<Vec<u8>> = Vec::new();
            for piece in stream.chunks(chunk) {
                d.push(piece);
                while let Some(f) = d.next_frame().unwrap() {
                    got.push(f.to_vec());
                }
            }
            assert_eq!(got, vec![b"one".to_vec(), vec![], b"three!!".to_vec()]);
            assert_eq!(d.finish(), Ok(()));
        }
    }

    #[test]
    fn oversized_and_truncated_frames_are_errors() {
        let mut d = Decoder::new(8);
        d.push(&100u32.to_be_bytes());
        assert_eq!(
            d.next_frame(),
            Err(FrameError::Oversized { len: 100, max: 8 })
        );
        d.push(b"more");
        assert!(d.next_frame().is_err(), "a poisoned decoder stays poisoned");
        assert!(encode(&[0; 9], 8, &mut Vec::new()).is_err());

        let mut d = Decoder::new(8);
        d.push(&[0, 0, 0, 5, 1, 2]);
        assert_eq!(d.next_frame(), Ok(None));
        assert_eq!(d.finish(), Err(FrameError::Truncated { buffered: 6 }));
    }
}
