//! Commits whose outcome is unknown when their caller gives up are decided by the log: with no
//! majority anywhere while 20 threads commit, each commit not ordered by its deadline (the
//! commit limit) never runs, and once the cluster heals every caller learns what became of its
//! commit from the node it used, and what it learns is what the store holds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use atomos::net::transport::LinkRule;
use atomos::{CertifyOptions, Cluster, CommitOutcome, Protocol, TRef, TxError};

const THREADS: usize = 20;
const LIMIT: Duration = Duration::from_millis(800);

/// What one thread saw: commits it knows ran, commits it knows never ran, and the tickets of
/// those it did not know about when they returned.
#[derive(Default, Debug)]
struct Seen {
    committed: u64,
    not_committed: u64,
    unknown: Vec<u64>,
}

fn cut_everything(c: &Cluster, rule: LinkRule) {
    for id in c.ids() {
        let transport = c.member(id).unwrap().rpc().transport().unwrap();
        for peer in c.ids() {
            if peer != id {
                transport.faults().set_peer(peer, rule);
            }
        }
    }
}

#[test]
fn commits_past_their_deadline_never_run_and_every_caller_learns_each_outcome() {
    let options = CertifyOptions {
        commit_limit: LIMIT,
        ..CertifyOptions::default()
    };
    let c = Arc::new(Cluster::in_process_with(3, Protocol::Certify, options).unwrap());
    let counters: Vec<TRef<u64>> = (0..THREADS)
        .map(|i| TRef::new(format!("outcomes/{i}")))
        .collect();
    let first = c.node(1).unwrap();
    for counter in &counters {
        first.atomically(|tx| tx.create(counter, 0)).unwrap();
    }
    for id in c.ids() {
        c.node(id).unwrap().sync().unwrap();
    }
    let cut_at = Instant::now() + Duration::from_millis(500);
    let heal_at = cut_at + LIMIT * 4;
    let stop_at = heal_at + Duration::from_millis(500);
    let threads: Vec<_> = (0..THREADS)
        .map(|i| {
            let (c, counter) = (c.clone(), counters[i].clone());
            std::thread::spawn(move || {
                let node = c.node(1 + (i % 3) as u64).unwrap();
                let mut seen = Seen::default();
                while Instant::now() < stop_at {
                    match node.atomically(|tx| tx.modify(&counter, |v| *v += 1)) {
                        Ok(()) => seen.committed += 1,
                        Err(TxError::OutcomeUnknown {
                            ticket: Some(t), ..
                        }) => seen.unknown.push(t),
                        Err(TxError::Refused { .. }) => seen.not_committed += 1,
                        Err(e) => panic!("thread {i}: {e}"),
                    }
                }
                seen
            })
        })
        .collect();
    std::thread::sleep(cut_at.saturating_duration_since(Instant::now()));
    // No two replicas can talk: no majority anywhere.
    cut_everything(
        &c,
        LinkRule {
            cut: true,
            ..Default::default()
        },
    );
    std::thread::sleep(heal_at.saturating_duration_since(Instant::now()));
    cut_everything(&c, LinkRule::default());
    let mut seen: Vec<Seen> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // Every caller learns each outcome from the node it committed on.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut late_committed, mut expired) = (0, 0);
    for (i, s) in seen.iter_mut().enumerate() {
        let member = c.member(1 + (i % 3) as u64).unwrap();
        for &ticket in &s.unknown {
            loop {
                match member.outcome(ticket) {
                    CommitOutcome::Committed => {
                        s.committed += 1;
                        late_committed += 1;
                    }
                    CommitOutcome::NotCommitted { .. } => {
                        s.not_committed += 1;
                        expired += 1;
                    }
                    CommitOutcome::Pending => {
                        assert!(
                            Instant::now() < deadline,
                            "thread {i}: ticket {ticket} still pending after the heal"
                        );
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                    CommitOutcome::Unknown => panic!("thread {i}: ticket {ticket} unknown"),
                }
                break;
            }
        }
    }
    let unknown: usize = seen.iter().map(|s| s.unknown.len()).sum();
    println!(
        "{unknown} commits of unknown outcome: {expired} never ran, {late_committed} ran; \
         {} commits known at once",
        seen.iter().map(|s| s.committed).sum::<u64>() - late_committed
    );
    assert!(
        unknown >= THREADS,
        "callers should have given up while there was no majority"
    );
    assert!(expired > 0, "no commit expired");
    // What each caller learnt is what the store holds, on every replica: an expired commit
    // never ran, and nothing ran twice.
    for id in c.ids() {
        c.node(id).unwrap().sync().unwrap();
    }
    for id in c.ids() {
        let node = c.node(id).unwrap();
        for (i, counter) in counters.iter().enumerate() {
            let value = node.atomically_read(|tx| Ok(*tx.read(counter)?)).unwrap();
            assert_eq!(
                value, seen[i].committed,
                "node {id}, thread {i}: the store holds {value} increments, the caller \
                 learnt of {}",
                seen[i].committed
            );
        }
    }
}
