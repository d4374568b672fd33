//! Versioned messages in frames: `frame(postcard(wire_version, body))`.
//!
//! A build speaks every wire version from [`OLDEST_WIRE_VERSION`] to [`WIRE_VERSION`]. Each
//! connection's handshake settles on the newest version both sides speak, and every message on
//! it is stamped with that version (see [`encode_as`]). So during a rolling upgrade the new
//! build's members talk to the old build's at the old version and to each other at the new one.
//!
//! What may change from one wire version to the next, so that the previous one still decodes:
//! new kinds of message are new enum variants appended after every existing one (postcard numbers
//! variants in order), and their [`WireMessage::since`] names the version that introduced them.
//! A link that settled on an older version refuses to send them ([`crate::transport::SendError::TooNew`]),
//! and a receiver refuses one stamped with an older version than its own `since`. An existing
//! message's fields do not change: a changed message is a new variant.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::frame::{self, FrameError};

/// The newest wire version this build speaks. A peer whose versions do not meet this build's is
/// refused at the handshake; a message stamped with a version outside
/// [`OLDEST_WIRE_VERSION`]..=[`WIRE_VERSION`] is refused when decoded. (14: stored values
/// tagged by declared names and encoded as MessagePack, procedure arguments as MessagePack;
/// 15: the order layer's entries say when their batch lapses, and lapsed batches order
/// nothing; 16: client sessions end by the log's time, and a request whose outcome the
/// cluster forgot is answered `Unknown`; 17: `oss` nodes send images of a domain to a node that
/// lacks write sets nobody keeps; 18: the handshake's preamble says the oldest and the newest
/// version a side speaks, and each connection speaks the newest both do.)
pub const WIRE_VERSION: u16 = 18;

/// The oldest wire version this build still speaks: the previous release's, so that a cluster
/// can be upgraded one member at a time. Version 17 builds refuse any peer whose preamble does
/// not start with 17, which is why the preamble's first field is the oldest version spoken.
pub const OLDEST_WIRE_VERSION: u16 = 17;

pub use atomos_seam::WireMessage;

/// Why bytes are not a message this node can act on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The frame layer refused the stream.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The message was written for a wire version this build does not speak.
    #[error(
        "message of wire version {theirs}, this node speaks {OLDEST_WIRE_VERSION} to {WIRE_VERSION}"
    )]
    Version {
        /// The version in the message.
        theirs: u16,
    },
    /// The message is of a kind introduced after the version it is stamped with.
    #[error("a message of wire version {since} stamped with version {stamped}")]
    TooNew {
        /// The version that introduced the message's kind.
        since: u16,
        /// The version it was stamped with.
        stamped: u16,
    },
    /// The bytes do not decode to a message of the expected type, or have bytes left over.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// The message could not be encoded.
    #[error("cannot encode message: {0}")]
    Encode(String),
}

/// Appends `msg` to `out` as one frame stamped with [`WIRE_VERSION`] (see [`encode_as`]).
pub fn encode<M: Serialize>(msg: &M, max_frame: usize, out: &mut Vec<u8>) -> Result<(), WireError> {
    encode_as(WIRE_VERSION, msg, max_frame, out)
}

/// Appends `msg` to `out` as one frame stamped with wire `version`, serializing straight into
/// `out` (no intermediate buffer). The caller has checked that `msg` exists in that version
/// ([`WireMessage::since`]). On error `out` is left as it was.
pub fn encode_as<M: Serialize>(
    version: u16,
    msg: &M,
    max_frame: usize,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    let start = out.len();
    out.extend_from_slice(&[0; frame::PREFIX]);
    if let Err(e) = postcard::to_extend(&(version, msg), Append(out)) {
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

/// Decodes one frame's payload into a whole message: the version must be one this build
/// speaks, the message must exist in it, and every byte must belong to the message.
pub fn decode<M: DeserializeOwned + WireMessage>(payload: &[u8]) -> Result<M, WireError> {
    decode_stamped(payload).map(|(_, msg)| msg)
}

/// [`decode`], also returning the version the message was stamped with.
pub fn decode_stamped<M: DeserializeOwned + WireMessage>(
    payload: &[u8],
) -> Result<(u16, M), WireError> {
    let (version, rest): (u16, &[u8]) =
        postcard::take_from_bytes(payload).map_err(|e| WireError::Malformed(e.to_string()))?;
    if !(OLDEST_WIRE_VERSION..=WIRE_VERSION).contains(&version) {
        return Err(WireError::Version { theirs: version });
    }
    let (msg, rest): (M, &[u8]) =
        postcard::take_from_bytes(rest).map_err(|e| WireError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(WireError::Malformed(format!(
            "{} bytes after the end of the message",
            rest.len()
        )));
    }
    if msg.since() > version {
        return Err(WireError::TooNew {
            since: msg.since(),
            stamped: version,
        });
    }
    Ok((version, msg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    enum Msg {
        Ping(u64),
        Write {
            key: Vec<u8>,
            value: Vec<u8>,
        },
        /// Introduced by the newest version.
        Fresh,
    }

    impl WireMessage for Msg {
        fn since(&self) -> u16 {
            match self {
                Msg::Fresh => WIRE_VERSION,
                _ => OLDEST_WIRE_VERSION,
            }
        }
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
    fn every_version_spoken_decodes_and_others_are_refused() {
        for version in OLDEST_WIRE_VERSION..=WIRE_VERSION {
            let mut out = Vec::new();
            encode_as(version, &Msg::Ping(7), 1024, &mut out).unwrap();
            assert_eq!(
                decode_stamped::<Msg>(payload(&out)),
                Ok((version, Msg::Ping(7)))
            );
        }
        for version in [OLDEST_WIRE_VERSION - 1, WIRE_VERSION + 1] {
            let other = postcard::to_stdvec(&(version, Msg::Ping(1))).unwrap();
            assert_eq!(
                decode::<Msg>(&other),
                Err(WireError::Version { theirs: version })
            );
        }
    }

    #[test]
    fn a_message_stamped_older_than_its_kind_is_refused() {
        let mut out = Vec::new();
        encode_as(WIRE_VERSION, &Msg::Fresh, 1024, &mut out).unwrap();
        assert_eq!(decode::<Msg>(payload(&out)), Ok(Msg::Fresh));
        out.clear();
        encode_as(OLDEST_WIRE_VERSION, &Msg::Fresh, 1024, &mut out).unwrap();
        assert_eq!(
            decode::<Msg>(payload(&out)),
            Err(WireError::TooNew {
                since: WIRE_VERSION,
                stamped: OLDEST_WIRE_VERSION
            })
        );
    }

    #[test]
    fn leftovers_and_unknown_kinds_are_refused() {
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
