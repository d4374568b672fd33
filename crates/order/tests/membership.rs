//! Membership changes at one replica, stepped by hand: what the leader refuses and why, what
//! it proposes, what a replica applies, and that a founder's log keeps the founding
//! configuration whatever the replica is configured with later. (The simulation in `sim.rs`
//! runs changes across a cluster under faults.)

use atomos_order::{
    decode_log, ChangeRefused, Command, Delivery, Input, MemberChange, OrderMsg, Register, Replica,
    ReplicaConfig,
};
use atomos_seam::{Machine, Output, Write};
use prost::Message as _;

/// A replica, with every record it wrote (each write confirmed at once).
struct Solo {
    replica: Replica<Register>,
    log: Vec<Vec<u8>>,
    written: u64,
    deliveries: Vec<Delivery>,
    /// Messages sent, oldest first.
    sent: Vec<(u64, OrderMsg)>,
    /// Requests [`Solo::put`] submitted (its client's numbers).
    puts: u64,
}

impl Solo {
    fn open(cfg: ReplicaConfig, log: Vec<Vec<u8>>) -> Solo {
        Solo::open_with(cfg, log, Register::new())
    }

    fn open_with(cfg: ReplicaConfig, log: Vec<Vec<u8>>, machine: Register) -> Solo {
        let records = decode_log(&log).expect("decodes");
        let replica = Replica::open(cfg, records, machine).expect("opens");
        Solo {
            replica,
            log,
            written: 0,
            deliveries: Vec::new(),
            sent: Vec::new(),
            puts: 0,
        }
    }

    fn step(&mut self, input: Input) {
        let mut out = Vec::new();
        self.replica.step(0, input, &mut out).expect("steps");
        let mut writes = 0;
        for o in out {
            match o {
                Output::Persist(Write::Append(records)) => {
                    self.log.extend(records.iter().map(|r| r.to_vec()));
                    writes += 1;
                }
                Output::Persist(Write::Rewrite(records) | Write::Compact(records)) => {
                    self.log = records.iter().map(|r| r.to_vec()).collect();
                    writes += 1;
                }
                Output::Deliver(d) => self.deliveries.push(d),
                Output::Send { to, msg } => self.sent.push((to, msg)),
                Output::Warn(_) => {}
            }
        }
        if writes > 0 {
            self.written += writes;
            let through = self.written;
            self.step(Input::Persisted { through });
        }
    }

    /// Orders a write of `bytes` bytes to register `key` (client 100's next request) and seals
    /// its batch.
    fn put(&mut self, key: &str, bytes: usize) {
        let value = vec![(self.puts + 1) as u8; bytes];
        self.order(atomos_order::RegisterOp::Put {
            key: key.into(),
            value,
        });
    }

    /// Orders `op` as client 100's next request and seals its batch.
    fn order(&mut self, op: atomos_order::RegisterOp) {
        use atomos_order::{Request, NO_DEADLINE};
        self.puts += 1;
        let request = Request {
            client: 100,
            seq: self.puts,
            payload: op.encode(),
            deadline_ms: NO_DEADLINE,
        };
        self.step(Input::Message {
            from: 100,
            msg: OrderMsg::Request(request),
        });
        self.step(Input::Request(Command::Flush));
    }

    /// Ticks until the replica leads (a cluster of one elects itself).
    fn lead(&mut self) {
        for _ in 0..200 {
            if self.replica.is_leader() {
                return;
            }
            self.step(Input::Tick);
        }
        panic!("never led: {}", self.replica.describe());
    }

    /// Asks for `change` and returns the answer.
    fn ask(&mut self, ticket: u64, change: MemberChange) -> Result<u64, ChangeRefused> {
        self.step(Input::Request(Command::ChangeMembership { ticket, change }));
        self.deliveries
            .iter()
            .rev()
            .find_map(|d| match d {
                Delivery::MemberChange { ticket: t, result } if *t == ticket => {
                    Some(result.clone())
                }
                _ => None,
            })
            .expect("answered")
    }
}

#[test]
fn the_leader_refuses_changes_that_make_no_sense_and_says_why() {
    let mut follower = Solo::open(ReplicaConfig::new(1, vec![1, 2, 3]), Vec::new());
    assert_eq!(
        follower.ask(1, MemberChange::Remove { id: 2 }),
        Err(ChangeRefused::NotLeader { leader: None })
    );
    let mut solo = Solo::open(ReplicaConfig::new(1, vec![1]), Vec::new());
    solo.lead();
    let add = |id| MemberChange::AddLearner {
        id,
        context: b"10.0.0.2:7400".to_vec(),
    };
    assert_eq!(solo.ask(1, add(1)), Err(ChangeRefused::AlreadyMember(1)));
    assert_eq!(
        solo.ask(2, MemberChange::Promote { id: 2 }),
        Err(ChangeRefused::NotLearner(2))
    );
    assert_eq!(
        solo.ask(3, MemberChange::Remove { id: 1 }),
        Err(ChangeRefused::LastVoter)
    );
    assert_eq!(
        solo.ask(4, MemberChange::Remove { id: 7 }),
        Err(ChangeRefused::NotMember(7))
    );
    assert_eq!(
        solo.ask(5, MemberChange::Replace { remove: 3, add: 2 }),
        Err(ChangeRefused::NotVoter(3))
    );
    // Nothing was proposed: the membership is the founding one.
    assert_eq!(solo.replica.membership().voters, vec![1]);
    assert!(solo.replica.membership().learners.is_empty());
}

#[test]
fn a_learner_is_added_with_its_context_and_promoted_only_once_caught_up() {
    let mut solo = Solo::open(ReplicaConfig::new(1, vec![1]), Vec::new());
    solo.lead();
    let context = b"10.0.0.2:7400".to_vec();
    let at = solo
        .ask(
            1,
            MemberChange::AddLearner {
                id: 2,
                context: context.clone(),
            },
        )
        .expect("proposed");
    // A cluster of one commits at once: the change applied at the position it was proposed
    // at, and the replica took a snapshot there.
    let applied = solo.deliveries.iter().find_map(|d| match d {
        Delivery::Membership { seq, membership } => Some((*seq, membership.clone())),
        _ => None,
    });
    let (seq, membership) = applied.expect("applied");
    assert_eq!(seq, at);
    assert_eq!(membership.voters, vec![1]);
    assert_eq!(membership.learners, vec![2]);
    assert_eq!(membership.contexts.get(&2), Some(&context));
    assert_eq!(solo.replica.stats().snapshots_taken, 1);
    assert_eq!(solo.replica.stats().membership_changes, 1);
    // Replica 2 never answered: its log reaches nothing.
    assert!(matches!(
        solo.ask(2, MemberChange::Promote { id: 2 }),
        Err(ChangeRefused::LearnerBehind {
            id: 2,
            delivered: 0,
            ..
        })
    ));
    // A restart reads the membership back from the snapshot, context included.
    let log = solo.log.clone();
    let reopened = Solo::open(ReplicaConfig::new(1, vec![1]), log);
    assert_eq!(reopened.replica.membership(), &membership);

    // The learner reports how far it delivered: short of the commit of the first ask, it is
    // refused still; a report past what Raft knows its log holds counts only that far; once
    // both got there, it is promoted.
    let target = solo.replica.commit();
    let report = |solo: &mut Solo, through| {
        solo.step(Input::Message {
            from: 2,
            msg: OrderMsg::Delivered { through },
        })
    };
    report(&mut solo, target);
    assert_eq!(
        solo.ask(10, MemberChange::Promote { id: 2 }),
        Err(ChangeRefused::LearnerBehind {
            id: 2,
            delivered: 0,
            target
        }),
        "a report beyond the log Raft knows it holds"
    );
    let appended = raft::eraftpb::Message {
        msg_type: raft::eraftpb::MessageType::MsgAppendResponse as i32,
        from: 2,
        to: 1,
        term: solo.replica.term(),
        index: target,
        ..Default::default()
    };
    solo.step(Input::Message {
        from: 2,
        msg: OrderMsg::Raft(appended.encode_to_vec()),
    });
    report(&mut solo, target - 1);
    assert_eq!(
        solo.ask(3, MemberChange::Promote { id: 2 }),
        Err(ChangeRefused::LearnerBehind {
            id: 2,
            delivered: target - 1,
            target
        })
    );
    report(&mut solo, target);
    let promoted = solo.ask(4, MemberChange::Promote { id: 2 });
    assert!(promoted.is_ok(), "{promoted:?}");
}

#[test]
fn a_founder_keeps_the_founding_configuration_whatever_it_is_configured_with_later() {
    let mut solo = Solo::open(ReplicaConfig::new(1, vec![1, 2, 3]), Vec::new());
    solo.step(Input::Tick);
    assert!(
        !solo.log.is_empty(),
        "the founders are written at the first start"
    );
    // Restarted with a list an operator edited since: the log's founders stand.
    let log = solo.log.clone();
    let reopened = Solo::open(ReplicaConfig::new(1, vec![1, 2, 3, 4]), log);
    assert_eq!(reopened.replica.membership().voters, vec![1, 2, 3]);
    // A replica that joins writes no founders and knows nobody until the cluster tells it.
    let mut joiner = Solo::open(ReplicaConfig::new(4, Vec::new()), Vec::new());
    joiner.step(Input::Tick);
    assert!(joiner.replica.membership().is_empty());
    assert!(joiner.log.is_empty());
}

/// A learner whose log lags re-proposes its batches because it does not see them ordered; the
/// leader orders each batch once (the simulation's joining replicas once grew the log to some
/// 1,500 entries for 100 requests this way).
#[test]
fn the_leader_orders_a_batch_once_however_often_it_is_proposed() {
    use atomos_order::{BatchId, OrderMsg, Request, NO_DEADLINE};
    use prost::Message as _;
    use raft::eraftpb::{Entry, Message, MessageType};

    let mut solo = Solo::open(ReplicaConfig::new(1, vec![1]), Vec::new());
    solo.lead();
    let add = MemberChange::AddLearner {
        id: 2,
        context: Vec::new(),
    };
    solo.ask(1, add).expect("proposed");
    // The learner's batch: the leader alone is a quorum, so it orders the batch on receipt.
    let id = BatchId { origin: 2, n: 7 };
    let requests = vec![Request {
        client: 9,
        seq: 1,
        payload: vec![1],
        deadline_ms: NO_DEADLINE,
    }];
    let batch = OrderMsg::Batch { id, requests };
    solo.step(Input::Message {
        from: 2,
        msg: batch,
    });
    let ordered_at = solo.replica.final_next() - 1;
    // The learner proposes it again, twice.
    let mut entry = Entry {
        data: postcard::to_stdvec(&id).expect("encodes"),
        ..Entry::default()
    };
    entry.set_entry_type(raft::eraftpb::EntryType::EntryNormal);
    let mut propose = Message {
        from: 2,
        to: 1,
        entries: vec![entry],
        ..Message::default()
    };
    propose.set_msg_type(MessageType::MsgPropose);
    for _ in 0..2 {
        let msg = OrderMsg::Raft(propose.encode_to_vec());
        solo.step(Input::Message { from: 2, msg });
    }
    assert_eq!(solo.replica.stats().proposals_dropped, 2);
    assert_eq!(
        solo.replica.final_next() - 1,
        ordered_at,
        "nothing more ordered"
    );
}

/// A log written before the state machine's state lay beside the snapshot (earlier builds held
/// it inside the snapshot's data) still opens, with the same state and membership, and the
/// snapshot raft-rs then holds is as small as one of this build.
#[test]
fn a_log_whose_snapshot_holds_the_state_inside_still_opens() {
    use atomos_order::{Record, StateMachine};
    use raft::eraftpb::Snapshot;

    let mut solo = Solo::open(ReplicaConfig::new(1, vec![1]), Vec::new());
    solo.lead();
    let add = MemberChange::AddLearner {
        id: 2,
        context: b"10.0.0.2:7400".to_vec(),
    };
    solo.ask(1, add).expect("proposed");
    assert_eq!(solo.replica.stats().snapshots_taken, 1);
    let records = decode_log(&solo.log).expect("decodes");
    let at = records
        .iter()
        .position(|r| matches!(r, Record::Installed(_)))
        .expect("a snapshot");
    let (Record::Installed(snap), Record::ImageFollows { .. }, Record::Image(image)) =
        (&records[at], &records[at + 1], &records[at + 2])
    else {
        panic!(
            "the snapshot's state follows it: {:?}",
            &records[at..at + 2]
        );
    };
    // The earlier layout: the state as the data's first field (a length, then the bytes)
    // where this build writes an empty one.
    let mut snap = Snapshot::decode(snap.as_slice()).expect("a snapshot");
    assert_eq!(snap.data.first(), Some(&0), "an empty first field");
    let mut data = Vec::new();
    let mut len = image.len() as u64;
    loop {
        let byte = (len & 0x7f) as u8;
        len >>= 7;
        if len == 0 {
            data.push(byte);
            break;
        }
        data.push(byte | 0x80);
    }
    data.extend_from_slice(image);
    data.extend_from_slice(&snap.data[1..]);
    snap.data = data;
    let mut old = solo.log.clone();
    old.splice(
        at..at + 3,
        [Record::Installed(snap.encode_to_vec()).encode()],
    );
    let reopened = Solo::open(ReplicaConfig::new(1, vec![1]), old);
    assert_eq!(reopened.replica.membership(), solo.replica.membership());
    assert_eq!(reopened.replica.machine(), solo.replica.machine());
    assert_eq!(&reopened.replica.machine().snapshot(), image);
    assert_eq!(
        reopened.replica.snapshot_bytes(),
        solo.replica.snapshot_bytes()
    );
    // A write torn right after the snapshot, or after its marker, before the state: the log
    // opens as if the snapshot had not been written, and the replica rewrites it before it
    // appends anything (else the marker left on the disk would take the next record for the
    // state, and the next start would fail; the simulation found this at seed 101).
    for keep in [at + 1, at + 2] {
        let mut torn = solo.log.clone();
        torn.truncate(keep);
        let mut reopened = Solo::open(ReplicaConfig::new(1, vec![1]), torn);
        assert_eq!(reopened.replica.snapshot_bytes(), 0, "cut at {keep}");
        reopened.lead();
        let again = Solo::open(ReplicaConfig::new(1, vec![1]), reopened.log.clone());
        assert_eq!(again.replica.snapshot_bytes(), 0, "cut at {keep}");
    }
}

/// Appends `n` values to register `k` as client 100's next requests, one batch each.
fn append_values(solo: &mut Solo, n: u64) {
    for _ in 0..n {
        let value = vec![(solo.puts + 1) as u8; 32];
        solo.order(atomos_order::RegisterOp::Append {
            key: "k".into(),
            value,
        });
    }
}

/// The messages between a leader (replica 1) and a learner (replica 2), delivered in order.
#[derive(Default)]
struct Link {
    to_learner: std::collections::VecDeque<OrderMsg>,
    to_leader: std::collections::VecDeque<OrderMsg>,
}

/// What `solo` sent to replica `id`, oldest first (the rest is dropped).
fn sent_to(solo: &mut Solo, id: u64) -> Vec<OrderMsg> {
    solo.sent
        .drain(..)
        .filter(|(to, _)| *to == id)
        .map(|(_, msg)| msg)
        .collect()
}

impl Link {
    /// One round: both tick, the leader takes what the learner sent, and the learner what
    /// the leader sent, unless `held`. Returns the stream chunks the learner received.
    fn pump(&mut self, leader: &mut Solo, learner: &mut Solo, held: bool) -> usize {
        let mut chunks = 0;
        leader.step(Input::Tick);
        learner.step(Input::Tick);
        self.to_learner.extend(sent_to(leader, 2));
        self.to_leader.extend(sent_to(learner, 1));
        while let Some(msg) = self.to_leader.pop_front() {
            leader.step(Input::Message { from: 2, msg });
        }
        self.to_learner.extend(sent_to(leader, 2));
        if !held {
            while let Some(msg) = self.to_learner.pop_front() {
                chunks += usize::from(matches!(msg, OrderMsg::StreamChunk { .. }));
                learner.step(Input::Message { from: 1, msg });
            }
        }
        chunks
    }

    /// Rounds until the learner delivered as far as the leader (at most `rounds`).
    fn catch_up(&mut self, leader: &mut Solo, learner: &mut Solo, rounds: usize) {
        for _ in 0..rounds {
            if learner.replica.final_next() == leader.replica.final_next() {
                break;
            }
            self.pump(leader, learner, false);
        }
        assert_eq!(
            learner.replica.final_next(),
            leader.replica.final_next(),
            "the learner caught up: {}",
            learner.replica.describe()
        );
    }
}

/// `cfg` for replica 2, joining.
fn learner_cfg(cfg: &ReplicaConfig) -> ReplicaConfig {
    ReplicaConfig {
        id: 2,
        replicas: Vec::new(),
        ..cfg.clone()
    }
}

/// A fresh learner, replica 2, configured as `cfg` but joining.
fn learner_of(cfg: &ReplicaConfig) -> Solo {
    Solo::open(learner_cfg(cfg), Vec::new())
}

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
    let add = MemberChange::AddLearner {
        id: 2,
        context: b"10.0.0.2:7400".to_vec(),
    };
    leader.ask(1, add).expect("proposed");
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
    let add = MemberChange::AddLearner {
        id: 2,
        context: b"10.0.0.2:7400".to_vec(),
    };
    leader.ask(1, add).expect("proposed");
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
    let add = MemberChange::AddLearner {
        id: 2,
        context: b"10.0.0.2:7400".to_vec(),
    };
    leader.ask(1, add).expect("proposed");
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
