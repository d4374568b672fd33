//! Membership changes at one replica, stepped by hand: what the leader refuses and why, what
//! it proposes, what a replica applies, and that a founder's log keeps the founding
//! configuration whatever the replica is configured with later. (The simulation in `sim.rs`
//! runs changes across a cluster under faults.)

mod solo;

use atomos_order::{
    decode_log, ChangeRefused, Delivery, Input, MemberChange, OrderMsg, ReplicaConfig,
};
use prost::Message as _;
use solo::Solo;

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
    solo.add_learner_2();
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
