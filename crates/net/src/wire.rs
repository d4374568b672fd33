//! Versioned messages in frames: `frame(postcard(wire_version, body))`.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::frame::{self, FrameError};

/// The wire version this build speaks. A peer with another version is refused at the
/// handshake; a message carrying another version is refused when decoded.
pub const WIRE_VERSION: u16 = 1;

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

/// Appends `msg` to `out` as one frame.
pub fn encode<M: Serialize>(msg: &M, max_frame: usize, out: &mut Vec<u8>) -> Result<(), WireError> {
    let payload =
        postcard::to_stdvec(&(WIRE_VERSION, msg)).map_err(|e| WireError::Encode(e.to_string()))?;
    frame::encode(&payload, max_frame, out)?;
    Ok(())
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
