//! A replica's snapshot taken on demand, copied out, and a new cluster started from the copy
//! (what backups and restores rest on).

mod solo;

use atomos_order::{Command, Input, OrderMsg, ReplicaConfig};
use solo::Solo;

fn put(solo: &mut Solo, key: &str, value: u64) {
    solo.order(atomos_order::RegisterOp::Put {
        key: key.into(),
        value: value.to_be_bytes().to_vec(),
    });
}

#[test]
fn a_snapshot_taken_on_demand_starts_a_new_cluster_with_other_members() {
    let mut old = Solo::open(ReplicaConfig::new(1, vec![1]), Vec::new());
    old.lead();
    old.now = 5_000;
    for i in 0..25u64 {
        put(&mut old, &format!("k{}", i % 5), i);
    }
    // The log is far shorter than `snapshot_every`: no snapshot yet, until one is asked for.
    assert!(old.replica.snapshot_copy().is_none());
    old.step(Input::Request(Command::SnapshotNow));
    let copy = old.replica.snapshot_copy().expect("a snapshot was taken");
    assert_eq!(copy.index, old.replica.final_next() - 1);
    assert_eq!(copy.log_time, 5_000);
    copy.check().expect("its tables decode");

    // Members 7 (alone, so that it leads by itself) start from it.
    let records = copy.seed_records(&[7]).expect("seeds");
    let log: Vec<Vec<u8>> = records.iter().map(|r| r.encode()).collect();
    let mut new = Solo::open(ReplicaConfig::new(7, vec![7]), log);
    assert_eq!(new.replica.final_next(), copy.index + 1);
    assert_eq!(new.replica.membership().voters, vec![7]);
    for i in 0..5 {
        assert_eq!(
            new.replica.machine().get(&format!("k{i}")),
            old.replica.machine().get(&format!("k{i}"))
        );
    }
    // It orders on top of the copy, at the positions after it, and its log time goes on.
    new.lead();
    new.now = 6_000;
    new.sent.clear();
    new.send(atomos_order::Request {
        client: 500,
        seq: 1,
        payload: atomos_order::RegisterOp::Put {
            key: "after".into(),
            value: vec![1],
        }
        .encode(),
        deadline_ms: 7_000,
    });
    assert_eq!(new.replica.machine().get("after"), Some(&[1u8][..]));
    assert!(new
        .sent
        .iter()
        .any(|(to, m)| *to == 500 && matches!(m, OrderMsg::Reply { .. })));
    assert!(new.replica.final_next() > copy.index + 1);
    assert!(new.replica.log_time() >= 6_000);
}

#[test]
fn a_new_cluster_needs_members() {
    let mut old = Solo::open(ReplicaConfig::new(1, vec![1]), Vec::new());
    old.lead();
    put(&mut old, "k", 1);
    old.step(Input::Request(Command::SnapshotNow));
    let copy = old.replica.snapshot_copy().expect("a snapshot was taken");
    assert!(copy.seed_records(&[]).is_err());
    assert!(copy.seed_records(&[0, 1]).is_err());
}
