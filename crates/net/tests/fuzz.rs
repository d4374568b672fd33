//! Random and mutated bytes fed to the decoders: every outcome is a message or a typed error,
//! never a panic, and never part of a message.

use atomos_net::frame::Decoder;
use atomos_net::handshake::Preamble;
use atomos_net::rpc::Envelope;
use atomos_net::tcp::LinkFrame;
use atomos_net::wire;
use proptest::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
enum Msg {
    Read { key: Vec<u8>, version: u64 },
    Write { key: Vec<u8>, value: Vec<u8> },
    Commit(u64, Vec<(Vec<u8>, u64)>),
    Hs(Preamble),
}

impl wire::WireMessage for Msg {}

fn msg() -> impl Strategy<Value = Msg> {
    let bytes = || proptest::collection::vec(any::<u8>(), 0..40);
    prop_oneof![
        (bytes(), any::<u64>()).prop_map(|(key, version)| Msg::Read { key, version }),
        (bytes(), bytes()).prop_map(|(key, value)| Msg::Write { key, value }),
        (
            any::<u64>(),
            proptest::collection::vec((bytes(), any::<u64>()), 0..5)
        )
            .prop_map(|(a, b)| Msg::Commit(a, b)),
        (".{0,12}", any::<u16>(), any::<u16>()).prop_map(|(cluster, oldest, newest)| {
            Msg::Hs(Preamble {
                oldest,
                cluster,
                newest,
            })
        }),
    ]
}

/// Decodes a whole stream: the messages, then the first error (if any).
fn decode_stream(bytes: &[u8], chunk: usize, max: usize) -> (Vec<Msg>, Option<String>) {
    let mut d = Decoder::new(max);
    let mut out = Vec::new();
    for piece in bytes.chunks(chunk.max(1)) {
        d.push(piece);
        loop {
            match d.next_frame() {
                Ok(Some(f)) => match wire::decode::<Msg>(f) {
                    Ok(m) => out.push(m),
                    Err(e) => return (out, Some(e.to_string())),
                },
                Ok(None) => break,
                Err(e) => return (out, Some(e.to_string())),
            }
        }
    }
    let end = d.finish().err().map(|e| e.to_string());
    (out, end)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    #[test]
    fn messages_round_trip_through_any_split(msgs in proptest::collection::vec(msg(), 0..8), chunk in 1usize..64) {
        let mut bytes = Vec::new();
        for m in &msgs {
            wire::encode(m, 4096, &mut bytes).unwrap();
        }
        let (got, err) = decode_stream(&bytes, chunk, 4096);
        prop_assert_eq!(err, None);
        prop_assert_eq!(got, msgs);
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512), chunk in 1usize..64, max in 0usize..256) {
        let _ = decode_stream(&bytes, chunk, max);
    }

    #[test]
    fn mutated_streams_yield_whole_messages_or_errors(
        msgs in proptest::collection::vec(msg(), 1..6),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut bytes = Vec::new();
        let mut frame_ends = Vec::new();
        for m in &msgs {
            wire::encode(m, 4096, &mut bytes).unwrap();
            frame_ends.push(bytes.len());
        }
        let mut first_damage = bytes.len();
        for (at, x) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= x | 1; // always changes the byte
            first_damage = first_damage.min(i);
        }
        if truncate {
            let at = cut.index(bytes.len());
            bytes.truncate(at);
            first_damage = first_damage.min(at);
        }
        let (got, err) = decode_stream(&bytes, 7, 4096);
        // Frames wholly before the first damaged byte decode exactly as sent; what follows is
        // whole messages or an error, never a panic.
        let intact = frame_ends.iter().filter(|&&end| end <= first_damage).count();
        prop_assert!(got.len() >= intact, "lost intact messages: {} of {}, error {:?}", got.len(), intact, err);
        prop_assert_eq!(&got[..intact], &msgs[..intact]);
    }

    #[test]
    fn random_bytes_as_transport_frames_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = wire::decode::<LinkFrame<Envelope<Msg>>>(&bytes);
    }

    #[test]
    fn random_and_mutated_preambles_decode_or_fail(
        bytes in proptest::collection::vec(any::<u8>(), 0..64),
        oldest in any::<u16>(),
        newest in any::<u16>(),
        cluster in ".{0,12}",
        flip in (any::<prop::sample::Index>(), any::<u8>()),
    ) {
        let _ = Preamble::decode(&bytes);
        let preamble = Preamble { oldest, cluster, newest };
        let mut sent = postcard::to_stdvec(&preamble).unwrap();
        if newest >= oldest {
            prop_assert_eq!(Preamble::decode(&sent), Ok(preamble));
        } else {
            prop_assert!(Preamble::decode(&sent).is_err());
        }
        let i = flip.0.index(sent.len());
        sent[i] ^= flip.1 | 1;
        if let Ok(p) = Preamble::decode(&sent) {
            prop_assert!(p.newest >= p.oldest);
        }
    }

    #[test]
    fn mutated_transport_frames_decode_whole_or_fail(
        m in msg(),
        id in any::<u64>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let frame = LinkFrame::App(Envelope::Request { id, body: m });
        let mut bytes = Vec::new();
        wire::encode(&frame, 4096, &mut bytes).unwrap();
        let payload = &mut bytes[atomos_net::frame::PREFIX..];
        for (at, x) in flips {
            let i = at.index(payload.len());
            payload[i] ^= x | 1;
        }
        // Either some whole frame (the flips may land on a value that still parses) or an error.
        let _ = wire::decode::<LinkFrame<Envelope<Msg>>>(payload);
    }
}
