//! Order-layer and Raft messages fed to a replica of a cluster with a log, a leader, batches
//! and snapshots.

use std::sync::atomic::Ordering;

use arbitrary::{Arbitrary, Unstructured};
use atomos::order::{OrderMsg, Register, Replica, ReplicaConfig};
use atomos::NodeMsg;
use atomos_seam::{Input, Machine};
use prost::Message as _;
use raft::eraftpb::{
    ConfState, Entry, EntryType, Message, MessageType, Snapshot, SnapshotMetadata,
};

use super::wire::*;
use atomos_sim::fuzz::*;

/// A Raft message built field by field from unstructured bytes (raft-rs's types do not
/// implement `Arbitrary`).
pub(crate) fn arbitrary_raft(u: &mut Unstructured) -> arbitrary::Result<Message> {
    // Mostly small terms (to meet the replica's), sometimes any at all.
    let term = |u: &mut Unstructured| -> arbitrary::Result<u64> {
        if u.ratio(1, 16u8)? {
            u.arbitrary()
        } else {
            u.int_in_range(0..=5)
        }
    };
    let mut m = Message {
        to: u.int_in_range(0..=4)?,
        from: u.int_in_range(0..=4)?,
        term: term(u)?,
        log_term: u.int_in_range(0..=5)?,
        index: u.int_in_range(0..=20)?,
        commit: u.int_in_range(0..=20)?,
        reject: u.arbitrary()?,
        reject_hint: u.int_in_range(0..=20)?,
        request_snapshot: u.int_in_range(0..=20)?,
        priority: u.arbitrary()?,
        ..Default::default()
    };
    m.set_msg_type(match u.int_in_range(0..=5u8)? {
        0 => MessageType::MsgAppend,
        1 => MessageType::MsgHeartbeat,
        2 => MessageType::MsgRequestVote,
        3 => MessageType::MsgSnapshot,
        4 => MessageType::MsgAppendResponse,
        _ => MessageType::MsgRequestPreVote,
    });
    for _ in 0..u.int_in_range(0..=3)? {
        let mut e = Entry {
            term: u.int_in_range(0..=5)?,
            index: u.int_in_range(0..=20)?,
            data: u.arbitrary::<Vec<u8>>()?,
            ..Default::default()
        };
        e.set_entry_type(if u.arbitrary()? {
            EntryType::EntryNormal
        } else {
            EntryType::EntryConfChange
        });
        m.entries.push(e);
    }
    if m.get_msg_type() == MessageType::MsgSnapshot {
        m.snapshot = Some(Snapshot {
            data: u.arbitrary::<Vec<u8>>()?,
            metadata: Some(SnapshotMetadata {
                index: if u.ratio(1, 16u8)? {
                    u.arbitrary()?
                } else {
                    u.int_in_range(0..=20)?
                },
                term: term(u)?,
                conf_state: Some(ConfState {
                    voters: vec![1, 2, 3],
                    ..Default::default()
                }),
            }),
        });
    }
    Ok(m)
}

/// Three replicas passing messages to each other with a client's requests, so the one under
/// fuzzing has a log, a leader, batches and snapshots to get wrong. Writes count as durable
/// at once.
pub(crate) struct OrderCluster {
    pub(crate) replicas: Vec<Replica<Register>>,
    pub(crate) written: Vec<u64>,
    pub(crate) queue: std::collections::VecDeque<(u64, u64, OrderMsg)>,
    pub(crate) seq: u64,
}

pub(crate) fn replica(id: u64) -> Replica<Register> {
    let mut cfg = ReplicaConfig::new(id, vec![1, 2, 3]);
    cfg.snapshot_every = 20;
    Replica::open(cfg, Vec::new(), Register::new()).expect("opens")
}

impl OrderCluster {
    pub(crate) fn new() -> OrderCluster {
        OrderCluster {
            replicas: (1..=3).map(replica).collect(),
            written: vec![0; 3],
            queue: Default::default(),
            seq: 0,
        }
    }

    /// Steps replica `to` with `input` and carries out what it asks. A replica that fails
    /// restarts empty (a node whose replica stops is restarted by its supervisor).
    pub(crate) fn step(&mut self, now: u64, to: u64, input: atomos::order::Input) {
        let i = to as usize - 1;
        let mut out = Vec::new();
        if self.replicas[i].step(now, input, &mut out).is_err() {
            self.replicas[i] = replica(to);
            self.written[i] = 0;
            return;
        }
        let mut wrote = false;
        for o in out {
            match o {
                atomos_seam::Output::Send { to: dest, msg } if (1..=3).contains(&dest) => {
                    self.queue.push_back((to, dest, msg))
                }
                atomos_seam::Output::Persist(_) => {
                    self.written[i] += 1;
                    wrote = true;
                }
                _ => {}
            }
        }
        if wrote {
            let through = self.written[i];
            self.step(now, to, Input::Persisted { through });
        }
    }

    /// One round of honest traffic: a client request, ticks, and the messages in flight.
    pub(crate) fn round(&mut self, now: u64) {
        self.seq += 1;
        let request = atomos::order::Request {
            client: 100,
            seq: self.seq,
            payload: atomos::order::RegisterOp::Append {
                key: "k".into(),
                value: vec![self.seq as u8],
            }
            .encode(),
            deadline_ms: atomos::order::NO_DEADLINE,
        };
        let to = 1 + self.seq % 3;
        let msg = OrderMsg::Request(request);
        self.step(now, to, Input::Message { from: 100, msg });
        for id in 1..=3 {
            self.step(now, id, Input::Tick);
        }
        for _ in 0..self.queue.len().min(64) {
            if let Some((from, to, msg)) = self.queue.pop_front() {
                self.step(now, to, Input::Message { from, msg });
            }
        }
    }
}

#[test]
pub(crate) fn order_and_raft_messages_decode_to_steps_or_errors() {
    let _one = serial();
    let mut tfa = tfa_node();
    let mut cluster = OrderCluster::new();
    for now in 0..200 {
        cluster.round(now);
    }
    let delivered_before = DELIVERED.load(Ordering::Relaxed);
    let start = first_seed();
    for seed in start..start + inputs() {
        let mut rng = Rng::new(seed ^ 0x0bde);
        let raft_inside = rng.below(2) == 0;
        let bytes = input_bytes(&mut rng, |u| {
            let msg = if raft_inside {
                let m = arbitrary_raft(u).ok()?;
                if m.get_msg_type() == MessageType::MsgSnapshot && u.arbitrary().ok()? {
                    OrderMsg::State {
                        snapshot: m.snapshot.unwrap_or_default().encode_to_vec(),
                    }
                } else {
                    OrderMsg::Raft(m.encode_to_vec())
                }
            } else {
                OrderMsg::arbitrary(u).ok()?
            };
            postcard::to_stdvec(&msg).ok()
        });
        let from = [2, 3, 9][rng.below(3) as usize];
        let now = 200 + seed - start;
        bounded(&format!("order seed {seed}"), || {
            if let Ok(msg) = postcard::from_bytes::<OrderMsg>(&bytes) {
                deliver(
                    &mut tfa,
                    &mut cluster.replicas[0],
                    now,
                    from,
                    NodeMsg::Order(msg),
                );
            }
        });
        if seed % 4 == 0 {
            cluster.round(now);
        }
    }
    reached(delivered_before, &cluster.replicas[0], &tfa);
    // The others heard only honest replicas: the guard refused none of their messages, and the
    // cluster got on with its work.
    for r in &cluster.replicas[1..] {
        assert_eq!(r.stats().raft_refused, 0, "{}", r.describe());
        assert!(r.final_next() > 100, "{}", r.describe());
    }
}
