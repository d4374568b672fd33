//! Versioned messages in frames: `frame(postcard(wire_version, body))`.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::frame::{self, FrameError};

/// The wire version this build speaks. A peer with another version is refused at the
/// handshake; a message carrying another version is refused when decoded. (14: stored values
/// tagged by declared names and encoded as MessagePack, procedure arguments as MessagePack;
/// 15: the order layer's entries say when their batch lapses, and lapsed batches order
/// nothing; 16: client sessions end by the log's time, and a request whose outcome the
/// cluster forgot is answered `Unknown`; 17: `oss` nodes send images of a domain to a node that
/// lacks write sets nobody keeps.)
pub const WIRE_VERSION: u16 = 17;

/// Why bytes are not a message this node can act on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The frame layer refused the stream.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The message was written for another wire version.
    #[error("message of wire version {theirs}, this node speaks {ours}")]
    Version {
        /// The version in the message.
        theirs: u16,
        /// Ours.
        ours: u16,
    },
    /// The bytes do not decode to a message of the expected type, or have bytes left over.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// The message could not be encoded.
    #[error("cannot encode message: {0}")]
    Encode(String),
}

/// Appends `msg` to `out` as one frame, serializing straight into `out` (no intermediate
/// buffer). On error `out` is left as it was.
pub fn encode<M: Serialize>(msg: &M, max_frame: usize, out: &mut Vec<u8>) -> Result<(), WireError> {
    let start = out.len();
    out.extend_from_slice(&[0; frame::PREFIX]);
    if let Err(e) = postcard::to_extend(&(WIRE_VERSION, msg), Append(out)) {
        out.truncate(start);
        return Err(WireError::Encode(e.to_string()));
    }
    let len = out.len() - start - frame::PREFIX;
    if len > max_frame || len > u32::MAX as usize {
        out.truncate(start);
        return Err(FrameError::Oversized {
            len,
            max: max_frame,
        }
        .into());
    }
    out[start..start + frame::PREFIX].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(())
}

/// Lets postcard append to a borrowed buffer.
struct Append<'a>(&'a mut Vec<u8>);

impl Extend<u8> for Append<'_> {
    fn extend<I: IntoIterator<Item = u8>>(&mut self, bytes: I) {
        self.0.extend(bytes)
    }
}

/// Decodes one frame's payload into a whole message: the version must be ours and every byte
/// must belong to the message.
pub fn decode<M: DeserializeOwned>(payload: &[u8]) -> Result<M, WireError> {
    let (version, rest): (u16, &[u8]) =
        postcard::take_from_bytes(payload).map_err(|e| WireError::Malformed(e.to_string()))?;
    if version != WIRE_VERSION {
        return Err(WireError::Version {
            theirs: version,
            ours: WIRE_VERSION,
        });
    }
    let (msg, rest): (M, &[u8]) =
        postcard::take_from_bytes(rest).map_err(|e| WireError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(WireError::Malformed(format!(
            "{} bytes after the end of the message",
            rest.len()
        )));
    }
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    enum Msg {
        Ping(u64),
        Write { key: Vec<u8>, value: Vec<u8> },
    }

    fn payload(bytes: &[u8]) -> &[u8] {
        &bytes[frame::PREFIX..]
    }

    #[test]
    fn messages_round_trip() {
        let m = Msg::Write {
            key: b"k".to_vec(),
            value: vec![1, 2, 3],
        };
        let mut out = Vec::new();
        encode(&m, 1024, &mut out).unwrap();
        assert_eq!(decode::<Msg>(payload(&out)), Ok(m));
    }

    #[test]
    fn oversized_messages_leave_the_buffer_unchanged() {
        let mut out = vec![9, 9];
        let big = Msg::Write {
            key: vec![0; 100],
            value: vec![],
        };
        assert!(matches!(
            encode(&big, 50, &mut out),
            Err(WireError::Frame(FrameError::Oversized { .. }))
        ));
        assert_eq!(out, vec![9, 9]);
        encode(&Msg::Ping(3), 50, &mut out).unwrap();
        assert_eq!(decode::<Msg>(&out[2 + frame::PREFIX..]), Ok(Msg::Ping(3)));
    }

    #[test]
    fn other_versions_and_leftovers_are_refused() {
        let other = postcard::to_stdvec(&(WIRE_VERSION + 1, Msg::Ping(1))).unwrap();
        assert_eq!(
            decode::<Msg>(&other),
            Err(WireError::Version {
                theirs: WIRE_VERSION + 1,
                ours: WIRE_VERSION
            })
        );
        let mut extra = postcard::to_stdvec(&(WIRE_VERSION, Msg::Ping(1))).unwrap();
        extra.push(0);
        assert!(matches!(
            decode::<Msg>(&extra),
            Err(WireError::Malformed(_))
        ));
        // An unknown variant tag.
        let unknown = postcard::to_stdvec(&(WIRE_VERSION, 7u8)).unwrap();
        assert!(matches!(
            decode::<Msg>(&unknown),
            Err(WireError::Malformed(_))
        ));
    }
}
