//! Membership changes on running nodes (in process, over in-memory links): a node joins a
//! `certify` cluster as a learner, is promoted, and the leader is removed, while transfers run;
//! nothing acknowledged is lost and the bank's total holds on the members that remain.
//! Protocols that do not change members refuse, saying why.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atomos::order::{ChangeRefused, MemberChange, Membership};
use atomos::ordering::MembershipError;
use atomos::{Cluster, ClusterError, Protocol, TRef};

const ACCOUNTS: usize = 8;
const BALANCE: i64 = 100;

fn accounts() -> Vec<TRef<i64>> {
    (0..ACCOUNTS)
        .map(|i| TRef::new(format!("member-bank/{i}")))
        .collect()
}

/// The member that leads now, as the members see it.
fn leader(c: &Cluster) -> Option<u64> {
    c.ids().into_iter().find(|&id| {
        c.member(id)
            .and_then(|m| m.order())
            .is_some_and(|o| o.stats().leader)
    })
}

/// Asks the leader for `change` until it is proposed (the leader may change, or ask to wait
/// while an earlier change applies or a learner catches up).
fn change(c: &Cluster, change: MemberChange) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "{change:?} was never proposed");
        let Some(via) = leader(c) else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        match c.change_membership(via, change.clone()) {
            Ok(at) => return at,
            Err(ClusterError::Membership(MembershipError::Refused(
                ChangeRefused::NotLeader { .. }
                | ChangeRefused::UnderWay
                | ChangeRefused::LearnerBehind { .. }
                | ChangeRefused::VotersBehind { .. },
            ))) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("{change:?}: {e}"),
        }
    }
}

/// Waits until every running node's replica applied a membership `done` says is the one.
fn wait_membership(c: &Cluster, what: &str, done: impl Fn(&Membership) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let all = c.ids().into_iter().all(|id| {
            c.member(id)
                .and_then(|m| m.order())
                .is_some_and(|o| done(&o.membership()))
        });
        if all {
            return;
        }
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_node_joins_is_promoted_and_replaces_the_leader_while_transfers_run() {
    let mut c = Cluster::in_process(3, Protocol::Certify).expect("cluster starts");
    let accts = accounts();
    c.node(1)
        .unwrap()
        .atomically(|tx| {
            for a in &accts {
                tx.create(a, BALANCE)?;
            }
            Ok(())
        })
        .unwrap();

    // Transfers on nodes 2 and 3 the whole time; each one acknowledged is counted.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = [2u64, 3]
        .into_iter()
        .map(|id| {
            let node = c.node(id).unwrap().clone();
            let (stop, done, accts) = (stop.clone(), done.clone(), accounts());
            std::thread::spawn(move || {
                let mut i = id as usize;
                while !stop.load(Ordering::Relaxed) {
                    let (from, to) = (&accts[i % ACCOUNTS], &accts[(i * 7 + 3) % ACCOUNTS]);
                    i += 1;
                    if std::ptr::eq(from, to) {
                        continue;
                    }
                    let moved = node.atomically(|tx| {
                        tx.modify(from, |v| *v -= 1)?;
                        tx.modify(to, |v| *v += 1)
                    });
                    if moved.is_ok() {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();

    // Node 4 joins, learns, and becomes a voter.
    c.join(4).unwrap();
    change(
        &c,
        MemberChange::AddLearner {
            id: 4,
            context: Vec::new(),
        },
    );
    change(&c, MemberChange::Promote { id: 4 });
    wait_membership(&c, "4 votes", |m| m.voters == [1, 2, 3, 4]);

    // The leader goes: it proposes its own removal, steps down, and is decommissioned.
    let old = leader(&c).expect("a leader");
    change(&c, MemberChange::Remove { id: old });
    wait_membership(&c, "the old leader is gone", |m| {
        !m.contains(old) && m.voters.len() == 3
    });
    c.kill(old).unwrap();
    let before = done.load(Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(30);
    while done.load(Ordering::Relaxed) < before + 20 {
        assert!(
            Instant::now() < deadline,
            "no transfer after the leader left"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }

    // Every member left holds the same objects, and the money is all there, on node 4 too.
    let n4 = c.node(4).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while n4.sync().is_err() {
        assert!(Instant::now() < deadline, "node 4 never caught up");
    }
    let total: i64 = n4
        .atomically_read(|tx| {
            let mut sum = 0;
            for a in &accts {
                sum += *tx.read(a)?;
            }
            Ok(sum)
        })
        .unwrap();
    assert_eq!(total, BALANCE * ACCOUNTS as i64);
    assert!(done.load(Ordering::Relaxed) > 20, "transfers ran");
    println!(
        "{} transfers; leader {old} removed; members now {:?}",
        done.load(Ordering::Relaxed),
        n4_membership(&c)
    );
}

#[test]
fn protocols_that_keep_their_members_refuse_to_change_them() {
    for protocol in [Protocol::Tfa, Protocol::Local, Protocol::Oss] {
        let mut c = Cluster::in_process(3, protocol).expect("cluster starts");
        let refused = c.change_membership(1, MemberChange::Remove { id: 3 });
        match refused {
            Err(ClusterError::Membership(MembershipError::NotReplicated(p))) => {
                assert_eq!(p, protocol.to_string())
            }
            other => panic!("{protocol}: {other:?}"),
        }
        let joined = c.join(4).expect_err("refused");
        assert!(
            joined.to_string().contains("only certify and active"),
            "{protocol}: {joined}"
        );
    }
}

fn n4_membership(c: &Cluster) -> Membership {
    c.member(4).unwrap().order().unwrap().membership()
}
