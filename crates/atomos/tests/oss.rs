//! The `oss` protocol through the public API, on nodes in one process linked in memory: every
//! replicated object on every node, node-local keys committed without the network, the bank's
//! money conserved under concurrent transfers from every node, identical nodes afterwards,
//! and a clear error for what `oss` does not offer.

use std::time::{Duration, Instant};

use atomos::{Cluster, Protocol, TRef, TxError};

const ACCOUNTS: u64 = 8;

fn account(i: u64) -> TRef<i64> {
    TRef::new(atomos::Key::with_index("acct/", i))
}

#[test]
fn commits_reach_every_node_and_money_is_conserved() {
    let c = Cluster::in_process(3, Protocol::Oss).expect("cluster starts");
    let n1 = c.node(1).unwrap().clone();
    n1.atomically(|tx| {
        for i in 0..ACCOUNTS {
            tx.create(&account(i), 100)?;
        }
        Ok(())
    })
    .unwrap();
    // A barrier brings another node up to date.
    let n3 = c.node(3).unwrap();
    n3.sync().unwrap();
    assert_eq!(
        n3.atomically_read(|tx| Ok(*tx.read(&account(0))?)).unwrap(),
        100
    );
    c.node(2).unwrap().sync().unwrap();

    let threads: Vec<_> = c
        .ids()
        .into_iter()
        .map(|id| {
            let node = c.node(id).unwrap().clone();
            std::thread::spawn(move || {
                for k in 0..60u64 {
                    let (a, b) = ((id * 3 + k) % ACCOUNTS, (id * 5 + k * 7 + 1) % ACCOUNTS);
                    node.atomically(|tx| {
                        tx.modify(&account(a), |v| *v -= 1)?;
                        tx.modify(&account(b), |v| *v += 1)
                    })
                    .unwrap();
                    let total = node
                        .atomically_read(|tx| {
                            let mut sum = 0;
                            for i in 0..ACCOUNTS {
                                sum += *tx.read(&account(i))?;
                            }
                            Ok(sum)
                        })
                        .unwrap();
                    assert_eq!(total, 100 * ACCOUNTS as i64);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // Every node ends with the same replicated objects.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        for id in c.ids() {
            c.node(id).unwrap().sync().unwrap();
        }
        let objects: Vec<_> = c
            .ids()
            .iter()
            .map(|&id| {
                let mut o = c.node(id).unwrap().engine().snapshot_objects().unwrap();
                for x in &mut o {
                    x.1 = 0;
                }
                o
            })
            .collect();
        if objects.windows(2).all(|w| w[0] == w[1]) {
            break;
        }
        assert!(Instant::now() < deadline, "the nodes never converged");
        std::thread::sleep(Duration::from_millis(50));
    }
    let counters = c.member(1).unwrap().oss().unwrap().counters();
    assert!(counters.commits >= 60, "{counters:?}");
}

#[test]
fn node_local_keys_commit_alone_and_abstract_locks_are_refused() {
    let c = Cluster::in_process(3, Protocol::Oss).expect("cluster starts");
    let n2 = c.node(2).unwrap();
    let mine: TRef<u64> = TRef::new("local/visits");
    for i in 1..=5u64 {
        n2.atomically(|tx| {
            if tx.exists(&mine)? {
                tx.write(&mine, i)
            } else {
                tx.create(&mine, i)
            }
        })
        .unwrap();
    }
    let oss = c.member(2).unwrap().oss().unwrap();
    assert_eq!(oss.counters().local_commits, 5);
    assert_eq!(
        oss.counters().commits,
        0,
        "no local commit went to the sequencer"
    );
    // Another node never sees it.
    let n1 = c.node(1).unwrap();
    n1.sync().unwrap();
    assert!(!n1.atomically_read(|tx| tx.exists(&mine)).unwrap());
    let err = n1.tx().run(|tx| tx.abstract_lock("counter")).unwrap_err();
    assert!(matches!(err, TxError::Refused { .. }), "{err:?}");
}
