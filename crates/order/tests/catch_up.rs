//! Snapshots and catching up at one leader and one learner stepped by hand: when a leader
//! takes the snapshot a learner needs, what a snapshot keeps of the log, and how a replica
//! delivers a long log in bounded steps. (The simulation in `sim.rs` runs the same under
//! faults.)

mod solo;

use atomos_order::{
    decode_log, Command, Delivery, Input, OrderMsg, Register, Replica, ReplicaConfig,
};
use atomos_seam::{Machine, Output};
use prost::Message as _;
use solo::{append_values, learner_cfg, learner_of, Link, Solo};

/// A replica whose log no longer starts at the founding takes no snapshot when it applies a
/// change: the leader takes one when raft-rs wants to send the learner a snapshot and the
/// latest does not name it, and only then. (Every replica encoded its whole state at every
/// change before.)
#[test]
fn a_leader_takes_the_snapshot_a_learner_needs_when_it_is_wanted() {
    let mut cfg = ReplicaConfig::new(1, vec![1]);
    cfg.snapshot_every = 10;
    cfg.batch_max = 1;
    let mut leader = Solo::open(cfg.clone(), Vec::new());
    leader.lead();
    append_values(&mut leader, 15);
    let before = leader.replica.stats().snapshots_taken;
    assert!(before > 0 && leader.replica.snapshot_index() > 0);
    leader.add_learner_2();
    assert_eq!(
        leader.replica.stats().snapshots_taken,
        before,
        "no snapshot at the change"
    );
    let mut learner = learner_of(&cfg);
    Link::default().catch_up(&mut leader, &mut learner, 200);
    assert_eq!(learner.replica.stats().snapshots_installed, 1);
    assert_eq!(
        leader.replica.stats().snapshots_taken,
        before + 1,
        "one snapshot, for the learner"
    );
    assert_eq!(learner.replica.membership(), leader.replica.membership());
    // The install rewrote the learner's log: it starts with the snapshot, and reopens where
    // the learner stands.
    let records = decode_log(&learner.log).expect("decodes");
    assert!(matches!(records[0], atomos_order::Record::Installed(_)));
    let reopened = Solo::open(learner_cfg(&cfg), learner.log.clone());
    assert_eq!(reopened.replica.membership(), learner.replica.membership());
    assert_eq!(reopened.replica.machine(), learner.replica.machine());
}

/// A learner still installing a snapshot while the leader takes the next one catches up from
/// the log afterwards: the leader keeps the entries since its previous snapshot (and their
/// batches), so one snapshot is enough.
#[test]
fn a_learner_that_installs_a_snapshot_while_the_leader_takes_another_needs_only_one() {
    let mut cfg = ReplicaConfig::new(1, vec![1]);
    cfg.snapshot_every = 10;
    cfg.batch_max = 1;
    cfg.snapshot_chunk_bytes = 64;
    let mut leader = Solo::open(cfg.clone(), Vec::new());
    leader.lead();
    append_values(&mut leader, 15);
    leader.add_learner_2();
    let mut learner = learner_of(&cfg);
    let mut link = Link::default();
    // Until the snapshot's stream is under way, then the learner hears nothing for a while.
    for _ in 0..200 {
        let chunks = link.pump(&mut leader, &mut learner, false);
        if chunks > 0 || learner.replica.stats().snapshots_installed > 0 {
            break;
        }
    }
    assert_eq!(
        learner.replica.stats().snapshots_installed,
        0,
        "installed at once"
    );
    let first_snapshots = leader.replica.stats().snapshots_taken;
    // Meanwhile the leader takes another snapshot.
    append_values(&mut leader, 12);
    assert!(leader.replica.stats().snapshots_taken > first_snapshots);
    link.pump(&mut leader, &mut learner, true);
    link.catch_up(&mut leader, &mut learner, 2000);
    assert_eq!(
        learner.replica.stats().snapshots_installed,
        1,
        "one snapshot installed, the rest from the log"
    );
}

/// A snapshot keeps the entries since the previous one while their batches are small, and only
/// the newest of them after a burst of large writes (their batches would stay in memory).
#[test]
fn a_snapshot_keeps_the_newest_entries_since_the_previous_one_within_a_budget() {
    let mut cfg = ReplicaConfig::new(1, vec![1]);
    cfg.snapshot_every = 10;
    cfg.batch_max = 1;
    let mut solo = Solo::open(cfg, Vec::new());
    solo.lead();
    let put = |solo: &mut Solo, n: u64, bytes: usize| {
        for _ in 0..n {
            solo.put("k", bytes);
        }
    };
    let snapshot_after = |solo: &mut Solo, put: &mut dyn FnMut(&mut Solo)| {
        let before = solo.replica.snapshot_index();
        while solo.replica.snapshot_index() == before {
            put(solo);
        }
        before
    };
    // The first snapshot keeps nothing.
    snapshot_after(&mut solo, &mut |s| put(s, 1, 8));
    let first = solo.replica.snapshot_index();
    assert_eq!(solo.replica.log_span().0, first + 1);
    // Small writes: the next snapshot keeps the entries since the first.
    let previous = snapshot_after(&mut solo, &mut |s| put(s, 1, 8));
    assert_eq!(previous, first);
    assert_eq!(solo.replica.log_span().0, first + 1, "kept since the first");
    // 10 writes of 256 KiB (2.5 MiB of batches, the state 256 KiB): only the newest entries
    // whose batches fit 1 MiB are kept, three of them.
    let previous = snapshot_after(&mut solo, &mut |s| put(s, 1, 256 << 10));
    let latest = solo.replica.snapshot_index();
    assert!(latest > previous + 3);
    assert_eq!(
        solo.replica.log_span().0,
        latest + 1 - 3,
        "the newest three kept"
    );
}

/// A snapshot whose state is encoded off the replica's step is taken at the position it was
/// asked for, however far the replica applied meanwhile; one the host could not encode (empty
/// bytes) is not taken, and the replica asks again later.
#[test]
fn a_snapshot_encoded_off_the_step_is_taken_where_it_was_asked_for() {
    use atomos_order::Delivery;

    let mut cfg = ReplicaConfig::new(1, vec![1]);
    cfg.snapshot_every = 10;
    cfg.batch_max = 1;
    let mut solo = Solo::open_with(cfg, Vec::new(), Register::encoding_later());
    solo.lead();
    let mut put = |solo: &mut Solo| solo.put("k", 8);
    let asked = |solo: &mut Solo, put: &mut dyn FnMut(&mut Solo)| loop {
        put(solo);
        let found = solo.deliveries.iter().find_map(|d| match d {
            Delivery::EncodeSnapshot { seq, job } => Some((*seq, job.take())),
            _ => None,
        });
        if let Some((at, Some(job))) = found {
            solo.deliveries.clear();
            return (at, job);
        }
        assert!(solo.replica.final_next() < 100, "no snapshot asked for");
    };
    // The host could not encode the first: nothing is taken.
    let (first, _) = asked(&mut solo, &mut put);
    solo.step(Input::Request(Command::SnapshotEncoded {
        seq: first,
        state: Vec::new(),
    }));
    assert_eq!(solo.replica.snapshot_index(), 0);
    assert_eq!(solo.replica.stats().snapshots_failed, 1);
    // The next is asked for, and its state comes back after five more entries.
    let (second, job) = asked(&mut solo, &mut put);
    for _ in 0..5 {
        put(&mut solo);
    }
    assert_eq!(
        solo.replica.snapshot_index(),
        0,
        "not before its state came back"
    );
    solo.step(Input::Request(Command::SnapshotEncoded {
        seq: second,
        state: job(),
    }));
    assert_eq!(solo.replica.snapshot_index(), second);
    assert!(solo.replica.final_next() > second + 5);
}

/// A large state is not rewritten for a few small entries: a snapshot waits until the log
/// since the last one holds an eighth of the state (and `snapshot_every` entries).
#[test]
fn a_large_state_snapshots_once_the_log_holds_an_eighth_of_it() {
    let mut cfg = ReplicaConfig::new(1, vec![1]);
    cfg.snapshot_every = 10;
    cfg.batch_max = 1;
    let mut solo = Solo::open(cfg, Vec::new());
    solo.lead();
    let put = |solo: &mut Solo, key: &str, bytes: usize| solo.put(key, bytes);
    // A state of 1 MiB, snapshotted (the first snapshot has no state to weigh the log against).
    put(&mut solo, "big", 1 << 20);
    while solo.replica.snapshot_index() == 0 {
        put(&mut solo, "k", 8);
    }
    let first = solo.replica.snapshot_index();
    // 100 small writes (10 entries would have been enough before): no snapshot.
    for _ in 0..100 {
        put(&mut solo, "k", 8);
    }
    assert_eq!(
        solo.replica.snapshot_index(),
        first,
        "no snapshot for 100 small entries"
    );
    // 128 KiB of log at about 140 bytes an entry: fewer than 1,000 entries.
    let mut entries = 100;
    while solo.replica.snapshot_index() == first {
        put(&mut solo, "k", 8);
        entries += 1;
        assert!(entries < 1_000, "no snapshot after {entries} entries");
    }
    assert!(entries > 800, "a snapshot after only {entries} entries");
}

/// A snapshot stream that completes after the leader's term moved on (the leader changed while
/// it travelled) is still installed: its entries are committed whoever sent it.
#[test]
fn a_snapshot_that_arrives_after_a_new_term_began_is_still_installed() {
    use raft::eraftpb::{Message, MessageType};

    let mut leader = Solo::open(ReplicaConfig::new(1, vec![1]), Vec::new());
    leader.lead();
    leader.add_learner_2();
    let mut learner = Solo::open(
        ReplicaConfig {
            id: 2,
            replicas: Vec::new(),
            ..ReplicaConfig::new(2, vec![1])
        },
        Vec::new(),
    );
    let term = leader.replica.term();
    // The learner answers the leader's probe until the leader streams a snapshot; the stream is
    // held back.
    let mut stream = Vec::new();
    for _ in 0..50 {
        leader.step(Input::Tick);
        for (to, msg) in std::mem::take(&mut leader.sent) {
            match msg {
                _ if to != 2 => {}
                OrderMsg::StreamOffer { .. } | OrderMsg::StreamChunk { .. } => stream.push(msg),
                msg => learner.step(Input::Message { from: 1, msg }),
            }
        }
        for (_, msg) in std::mem::take(&mut learner.sent) {
            leader.step(Input::Message { from: 2, msg });
        }
        if !stream.is_empty() {
            break;
        }
    }
    assert!(!stream.is_empty(), "no snapshot streamed");
    // Meanwhile a later term began: the learner hears its leader's heartbeat.
    let heartbeat = Message {
        msg_type: MessageType::MsgHeartbeat as i32,
        from: 1,
        to: 2,
        term: term + 1,
        ..Default::default()
    };
    learner.step(Input::Message {
        from: 1,
        msg: OrderMsg::Raft(heartbeat.encode_to_vec()),
    });
    assert_eq!(learner.replica.term(), term + 1);
    for msg in stream {
        learner.step(Input::Message { from: 1, msg });
    }
    assert_eq!(learner.replica.stats().snapshots_installed, 1);
    assert_eq!(learner.replica.membership().learners, vec![2]);
}

/// A replica whose log holds committed entries whose batches it lacks (catching up from the
/// log) asks for all of them at once, not one round trip per entry.
#[test]
fn a_replica_catching_up_asks_for_the_batches_of_many_entries_at_once() {
    use atomos_order::BatchId;
    use raft::eraftpb::{Entry, Message, MessageType};

    let mut follower = Solo::open(ReplicaConfig::new(2, vec![1, 2, 3]), Vec::new());
    let entries: Vec<Entry> = (1..=5u64)
        .map(|n| Entry {
            index: n,
            term: 1,
            data: postcard::to_stdvec(&BatchId { origin: 1, n }).expect("encodes"),
            ..Default::default()
        })
        .collect();
    let append = Message {
        msg_type: MessageType::MsgAppend as i32,
        from: 1,
        to: 2,
        term: 1,
        log_term: 0,
        index: 0,
        commit: 5,
        entries,
        ..Default::default()
    };
    follower.step(Input::Message {
        from: 1,
        msg: OrderMsg::Raft(append.encode_to_vec()),
    });
    let mut asked: Vec<u64> = follower
        .sent
        .iter()
        .filter_map(|(_, m)| match m {
            OrderMsg::FetchBatch { id } => Some(id.n),
            _ => None,
        })
        .collect();
    asked.sort_unstable();
    asked.dedup();
    assert_eq!(asked, vec![1, 2, 3, 4, 5]);
}

/// A replica restarted on a long log delivers it a bounded number of entries per step, each
/// way, says it has more while it does (its host steps it again at once), and gets through
/// all of it; [`Replica::recover`] applies all of it too. (A learner applied its whole
/// backlog in one step before, silent for its peers for as long as that took.)
#[test]
fn a_long_log_is_delivered_a_bounded_number_of_entries_per_step() {
    let mut cfg = ReplicaConfig::new(1, vec![1]);
    let mut solo = Solo::open(cfg.clone(), Vec::new());
    solo.lead();
    append_values(&mut solo, 20);
    let delivered = solo.replica.final_next();
    let value = solo.replica.machine().get("k").map(<[u8]>::to_vec);
    assert_eq!(value.as_ref().map(Vec::len), Some(20 * 32));

    cfg.deliveries_per_step = 3;
    let mut reopened = Solo::open(cfg.clone(), solo.log.clone());
    let mut steps = 0;
    loop {
        let before = reopened.replica.final_next();
        let mut out = Vec::new();
        let input = Input::Request(Command::Flush);
        reopened.replica.step(0, input, &mut out).expect("steps");
        let count = |final_ones: bool| {
            out.iter()
                .filter(|o| match o {
                    Output::Deliver(Delivery::Final { .. }) => final_ones,
                    Output::Deliver(Delivery::Opt { .. }) => !final_ones,
                    _ => false,
                })
                .count()
        };
        assert!(count(true) <= 3 && count(false) <= 3, "step {steps}");
        assert_eq!(reopened.replica.final_next() - before, count(true) as u64);
        steps += 1;
        if !reopened.replica.has_backlog() {
            break;
        }
        assert!(steps < 100, "{}", reopened.replica.describe());
    }
    assert_eq!(reopened.replica.final_next(), delivered);
    assert!(steps >= 7, "20 entries and more in {steps} steps of 3");
    assert_eq!(
        reopened.replica.machine().get("k").map(<[u8]>::to_vec),
        value
    );

    let records = decode_log(&solo.log).expect("decodes");
    let (machine, applied) = Replica::recover(cfg, records, Register::new()).expect("recovers");
    assert_eq!(applied, delivered - 1);
    assert_eq!(machine.get("k").map(<[u8]>::to_vec), value);
}

/// A replica that runs for long forgets the batches it delivered once their requests' deadlines
/// are past in log time and a snapshot compacted their entries away: what it remembers stays
/// bounded by what the lifetime of a request and the log between snapshots hold.
#[test]
fn delivered_batches_are_forgotten_once_they_lapse() {
    let mut cfg = ReplicaConfig::new(1, vec![1]);
    cfg.snapshot_every = 10;
    cfg.batch_max = 1;
    let mut solo = Solo::open(cfg, Vec::new());
    solo.lead();
    let mut most = 0;
    for i in 0..600u64 {
        solo.now += 10;
        let deadline = solo.now + 100;
        solo.order_until(
            atomos_order::RegisterOp::Put {
                key: "k".into(),
                value: i.to_be_bytes().to_vec(),
            },
            deadline,
        );
        most = most.max(solo.replica.remembered_batches().0);
    }
    let (delivered, held) = solo.replica.remembered_batches();
    assert!(most < 60, "{most} delivered batches remembered at once");
    assert!(held < 60, "{held} batches held");
    assert!(delivered > 0);
    // Every write ran, once, in order.
    let finals = solo
        .deliveries
        .iter()
        .filter(|d| matches!(d, Delivery::Final { .. }))
        .count();
    assert!(finals >= 600);
    let value = solo.replica.machine().get("k").map(<[u8]>::to_vec);
    assert_eq!(value, Some(599u64.to_be_bytes().to_vec()));
    // A restart from the compacted log remembers no more.
    let mut again = ReplicaConfig::new(1, vec![1]);
    again.snapshot_every = 10;
    let mut restarted = Solo::open(again, solo.log.clone());
    restarted.lead();
    let remembered = restarted.replica.remembered_batches().0;
    assert!(remembered < 60, "{remembered} remembered after a restart");
    assert_eq!(
        restarted.replica.machine().get("k").map(<[u8]>::to_vec),
        Some(599u64.to_be_bytes().to_vec())
    );
}

/// Client sessions end once the log's time passes their latest deadline: 2,000 short-lived
/// clients leave a handful of sessions behind, before and after a restart from the compacted
/// log, and a copy of a request that ran, sent again after its session ended, is answered that
/// its outcome is unknown and does not run again.
#[test]
fn sessions_of_short_lived_clients_end_and_an_old_copy_never_runs_again() {
    let mut cfg = ReplicaConfig::new(1, vec![1]);
    cfg.snapshot_every = 10;
    cfg.batch_max = 1;
    let mut solo = Solo::open(cfg.clone(), Vec::new());
    solo.lead();
    let request = |client: u64, deadline_ms: u64| atomos_order::Request {
        client,
        seq: 1,
        payload: atomos_order::RegisterOp::Append {
            key: "k".into(),
            value: vec![1],
        }
        .encode(),
        deadline_ms,
    };
    let first = request(1_000, solo.now + 100);
    let mut most = 0;
    for client in 1_000..3_000u64 {
        solo.now += 10;
        let deadline = solo.now + 100;
        solo.send(request(client, deadline));
        most = most.max(solo.replica.sessions());
    }
    // A client every 10 ms, each session living 100 ms, swept once the 1,024 ms step of its
    // end is past: about 113 at most, whatever the number of clients.
    assert!(most < 130, "{most} sessions held at once");
    assert!(solo.replica.stats().sessions_forgotten > 1_900);
    let appended = |solo: &Solo| solo.replica.machine().get("k").map_or(0, <[u8]>::len);
    assert_eq!(appended(&solo), 2_000, "every client's request ran once");
    // The first client sends its request again: its session ended, so the replica cannot
    // tell whether it ran, and it cannot run (its deadline passed).
    solo.sent.clear();
    solo.send(first.clone());
    let answers: Vec<&OrderMsg> = solo.sent.iter().map(|(_, m)| m).collect();
    assert_eq!(
        answers,
        vec![&OrderMsg::Unknown {
            client: 1_000,
            seq: 1
        }]
    );
    assert_eq!(appended(&solo), 2_000);
    // A restart from the compacted log holds no more sessions, and decides alike.
    let mut restarted = Solo::open(cfg, solo.log.clone());
    restarted.now = solo.now;
    restarted.lead();
    assert!(restarted.replica.sessions() < 130);
    restarted.sent.clear();
    restarted.send(first);
    assert!(restarted
        .sent
        .iter()
        .all(|(_, m)| matches!(m, OrderMsg::Unknown { .. } | OrderMsg::Raft(_))));
    assert_eq!(appended(&restarted), 2_000);
}

/// An entry whose log time is past every deadline of its batch orders nothing (the batch has
/// lapsed there: decided from the entry alone): the request does not run, its client waiting
/// here learns it expired, and so does a copy sent again.
#[test]
fn a_batch_ordered_after_its_deadlines_orders_nothing() {
    let mut cfg = ReplicaConfig::new(1, vec![1]);
    cfg.batch_max = 1;
    let mut solo = Solo::open(cfg, Vec::new());
    solo.lead();
    solo.now = 100;
    solo.put("k", 1);
    // The log's time is 100; a request due by 500 is taken, and its entry is stamped 1,000.
    solo.now = 1_000;
    solo.sent.clear();
    solo.order_until(
        atomos_order::RegisterOp::Put {
            key: "k".into(),
            value: b"late".to_vec(),
        },
        500,
    );
    assert_eq!(solo.replica.machine().get("k"), Some(&[1u8][..]));
    assert_eq!(
        solo.replica.stats().batches_lapsed,
        1,
        "decided by the lapse"
    );
    assert!(
        !solo
            .sent
            .iter()
            .any(|(_, m)| matches!(m, OrderMsg::Reply { seq: 2, .. })),
        "the late request ran"
    );
    // Its client, waiting here, is told at once.
    assert!(solo
        .sent
        .iter()
        .any(|(_, m)| matches!(m, OrderMsg::Expired { seq: 2, .. })));
    solo.sent.clear();
    // Sent again, it is answered as expired.
    solo.step(Input::Message {
        from: 100,
        msg: OrderMsg::Request(atomos_order::Request {
            client: 100,
            seq: 2,
            payload: atomos_order::RegisterOp::Put {
                key: "k".into(),
                value: b"late".to_vec(),
            }
            .encode(),
            deadline_ms: 500,
        }),
    });
    assert!(solo
        .sent
        .iter()
        .any(|(_, m)| matches!(m, OrderMsg::Expired { seq: 2, .. })));
}
