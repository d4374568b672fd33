//! Raft bytes from peers (messages, entries, snapshots) are decoded with prost, whose decoder
//! has a recursion limit; protobuf 2.x's own parser (RUSTSEC-2024-0437: a stack overflow on
//! crafted input) is never called. Deeply nested and random bytes get an error, never a panic
//! or a stack overflow, and a replica fed them as messages changes nothing and goes on.

use atomos_seam::stable::SplitMix64;
use rand_core::{RngCore, SeedableRng};
use std::path::Path;

use atomos_order::{OrderMsg, OrderStats, Register, Replica, ReplicaConfig};
use atomos_seam::{Input, Machine};
use prost::Message as _;
use raft::eraftpb::{Entry, Message, Snapshot};

/// `depth` start-group tags of an unknown field, nested: what overflowed protobuf 2.x's stack.
fn nested_groups(depth: usize) -> Vec<u8> {
    let tag = (15 << 3) | 3; // field 15, wire type "start group"
    vec![tag; depth]
}

/// Deterministic pseudo-random bytes.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = SplitMix64::seed_from_u64(seed);
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

/// Where a replica stands, without the count of refused snapshots (which refusing changes).
fn standing(r: &Replica<Register>) -> String {
    let mut stats = r.stats();
    stats.snapshots_refused = 0;
    stats.raft_refused = 0;
    let described = r.describe();
    let place = described.split(", OrderStats").next().unwrap_or_default();
    format!("{place} {stats:?}")
}

#[test]
fn deep_nesting_and_noise_are_errors_not_crashes() {
    let deep = nested_groups(1_000_000);
    assert!(Message::decode(deep.as_slice()).is_err());
    assert!(Entry::decode(deep.as_slice()).is_err());
    assert!(Snapshot::decode(deep.as_slice()).is_err());
    for seed in 0..2_000 {
        let bytes = noise(seed, (seed as usize * 7) % 512);
        // Any outcome but a panic is fine: garbage may happen to be a valid message.
        let _ = Message::decode(bytes.as_slice());
        let _ = Entry::decode(bytes.as_slice());
        let _ = Snapshot::decode(bytes.as_slice());
    }
}

#[test]
fn a_replica_fed_crafted_raft_bytes_goes_on() {
    let cfg = ReplicaConfig::new(1, vec![1, 2, 3]);
    let mut r = Replica::open(cfg, Vec::new(), Register::new()).unwrap();
    let before = standing(&r);
    let mut out = Vec::new();
    for bytes in [nested_groups(100_000), noise(7, 300), Vec::new()] {
        for msg in [
            OrderMsg::Raft(bytes.clone()),
            OrderMsg::State {
                snapshot: bytes.clone(),
            },
        ] {
            r.step(0, Input::Message { from: 2, msg }, &mut out)
                .unwrap();
        }
    }
    assert_eq!(standing(&r), before);
}

#[test]
fn nothing_in_the_workspace_parses_with_protobuf_2() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut found = Vec::new();
    let mut stack = vec![root.join("crates")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with(file!()) {
                let text = std::fs::read_to_string(&path).unwrap();
                for pattern in ["parse_from_bytes", "parse_from(", "CodedInputStream"] {
                    if text.contains(pattern) {
                        found.push(format!("{} calls {pattern}", path.display()));
                    }
                }
            }
        }
    }
    // Only raft and raft-proto may depend on protobuf (raft 0.7 needs it for its traits).
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).unwrap();
    for package in lock.split("[[package]]") {
        let name = package
            .lines()
            .find_map(|l| l.strip_prefix("name = \""))
            .map(|n| n.trim_end_matches('"'))
            .unwrap_or("");
        let depends = package
            .lines()
            .any(|l| l.trim() == "\"protobuf\"," || l.trim().starts_with("\"protobuf 2"));
        if depends && name != "raft" && name != "raft-proto" {
            found.push(format!("{name} depends on protobuf"));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// A snapshot from a peer whose state does not decode: sent by Raft (as the leader's
/// `MsgSnapshot`) or in answer to a fetch (`State`), it is refused and the replica goes on
/// unchanged, instead of stopping on a corrupt state.
#[test]
fn a_snapshot_whose_state_does_not_decode_is_refused_not_fatal() {
    use raft::eraftpb::{ConfState, MessageType, SnapshotMetadata};
    let cfg = ReplicaConfig::new(1, vec![1, 2, 3]);
    let mut r = Replica::open(cfg, Vec::new(), Register::new()).unwrap();
    let before = standing(&r);
    let mut out = Vec::new();
    for data in [noise(3, 64), Vec::new(), nested_groups(1_000)] {
        let snapshot = Snapshot {
            data,
            metadata: Some(SnapshotMetadata {
                index: 5,
                term: 1,
                conf_state: Some(ConfState {
                    voters: vec![1, 2, 3],
                    ..Default::default()
                }),
            }),
        };
        let mut m = Message {
            from: 2,
            to: 1,
            term: 1,
            snapshot: Some(snapshot.clone()),
            ..Default::default()
        };
        m.set_msg_type(MessageType::MsgSnapshot);
        for msg in [
            OrderMsg::Raft(m.encode_to_vec()),
            OrderMsg::State {
                snapshot: snapshot.encode_to_vec(),
            },
        ] {
            r.step(0, Input::Message { from: 2, msg }, &mut out)
                .expect("a bad snapshot from a peer is not fatal");
        }
    }
    assert_eq!(standing(&r), before);
    assert_eq!(r.stats().snapshots_refused, 6);
    assert_eq!(r.stats().snapshots_installed, 0);
}

/// A snapshot at position 10 of term 1 with configuration `conf`.
fn snapshot_of(conf: raft::eraftpb::ConfState) -> Snapshot {
    Snapshot {
        data: Vec::new(),
        metadata: Some(raft::eraftpb::SnapshotMetadata {
            index: 10,
            term: 1,
            conf_state: Some(conf),
        }),
    }
}

/// Well-formed Raft messages that raft-rs would panic on (it trusts its peers), found by
/// fuzzing: they are refused before raft-rs sees them, and the replica goes on unchanged.
#[test]
fn raft_messages_that_would_panic_raft_rs_are_refused() {
    use raft::eraftpb::{Entry, MessageType};
    let cfg = ReplicaConfig::new(1, vec![1, 2, 3]);
    let mut r = Replica::open(cfg, Vec::new(), Register::new()).unwrap();
    let before = standing(&r);
    let base = Message {
        from: 2,
        to: 1,
        term: 1,
        ..Default::default()
    };
    let with = |kind: MessageType, edit: &dyn Fn(&mut Message)| {
        let mut m = base.clone();
        m.set_msg_type(kind);
        edit(&mut m);
        m
    };
    let crafted = [
        // A vote request without a term: raft-rs asserts on the answer it builds.
        with(MessageType::MsgRequestPreVote, &|m| m.term = 0),
        with(MessageType::MsgRequestVote, &|m| m.term = 0),
        // A type the enum does not have: the generated getter panics.
        Message {
            msg_type: 72,
            ..base.clone()
        },
        // A heartbeat committing beyond the log: raft-rs's commit_to panics.
        with(MessageType::MsgHeartbeat, &|m| m.commit = 50),
        // An empty forwarded proposal: "stepped empty MsgProp".
        with(MessageType::MsgPropose, &|m| m.term = 0),
        // Entries out of sequence, and a local message from the network.
        with(MessageType::MsgAppend, &|m| {
            m.entries = vec![
                Entry {
                    index: 5,
                    term: 1,
                    ..Default::default()
                },
                Entry {
                    index: 3,
                    term: 1,
                    ..Default::default()
                },
            ]
        }),
        with(MessageType::MsgHup, &|_| {}),
        // A term no cluster reaches: raft-rs computes term + 1 at its next election.
        with(MessageType::MsgHeartbeat, &|m| m.term = u64::MAX),
        // raft-rs reads the term past its log as 0: a zero term matches there and commits
        // beyond the log.
        with(MessageType::MsgAppend, &|m| {
            m.index = 1;
            m.log_term = 0;
            m.commit = 1;
        }),
        with(MessageType::MsgAppend, &|m| {
            m.entries = vec![Entry {
                index: 1,
                term: 0,
                ..Default::default()
            }];
            m.commit = 1;
        }),
        // A snapshot without a term, beyond the log.
        with(MessageType::MsgSnapshot, &|m| {
            m.snapshot = Some(Snapshot {
                data: Vec::new(),
                metadata: Some(raft::eraftpb::SnapshotMetadata {
                    index: 10,
                    term: 0,
                    conf_state: Some(raft::eraftpb::ConfState {
                        voters: vec![1, 2, 3],
                        ..Default::default()
                    }),
                }),
            })
        }),
        // A snapshot of a configuration raft-rs cannot restore as it stands (a voter that is
        // also a learner), and one without this replica.
        with(MessageType::MsgSnapshot, &|m| {
            m.snapshot = Some(snapshot_of(raft::eraftpb::ConfState {
                voters: vec![1, 2, 3],
                learners: vec![2],
                ..Default::default()
            }))
        }),
        with(MessageType::MsgSnapshot, &|m| {
            m.snapshot = Some(snapshot_of(raft::eraftpb::ConfState {
                voters: vec![2, 3, 4],
                ..Default::default()
            }))
        }),
        // A configuration change of the first version: replicas propose version 2 only.
        with(MessageType::MsgAppend, &|m| {
            let mut e = Entry {
                index: 1,
                term: 1,
                ..Default::default()
            };
            e.set_entry_type(raft::eraftpb::EntryType::EntryConfChange);
            m.entries = vec![e];
        }),
    ];
    let mut out = Vec::new();
    for m in crafted {
        let msg = OrderMsg::Raft(m.encode_to_vec());
        r.step(0, Input::Message { from: 2, msg }, &mut out)
            .expect("refused, not fatal");
    }
    assert_eq!(r.stats().raft_refused, 14);
    assert_eq!(standing(&r), before);
    let mut stats = r.stats();
    stats.raft_refused = 0;
    assert_eq!(stats, OrderStats::default());
}

/// raft-proto's generated code is committed (`third_party/raft-proto`): an entry as raft-rs
/// 0.7's protocol defines it (term 2, index 3, data, context) encodes to the bytes the
/// protocol's field numbers give, and decodes back, so the committed code is the protocol's.
#[test]
fn the_committed_raft_messages_keep_the_protocols_field_numbers() {
    let entry = Entry {
        term: 2,
        index: 3,
        data: vec![1, 2],
        context: vec![9],
        ..Entry::default()
    };
    let bytes = [0x10, 2, 0x18, 3, 0x22, 2, 1, 2, 0x32, 1, 9];
    assert_eq!(entry.encode_to_vec(), bytes);
    assert_eq!(Entry::decode(&bytes[..]).unwrap(), entry);
    let msg = Message {
        msg_type: 3, // MsgAppend
        to: 2,
        from: 1,
        term: 5,
        entries: vec![entry],
        ..Message::default()
    };
    let decoded = Message::decode(msg.encode_to_vec().as_slice()).unwrap();
    assert_eq!(decoded, msg);
    assert_eq!(
        decoded.get_msg_type(),
        raft::eraftpb::MessageType::MsgAppend
    );
}
