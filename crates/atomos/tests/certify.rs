//! The `certify` protocol through the public API, on replicas in one process linked in memory:
//! the same application code as on a local node, every object on every replica, the bank's
//! money conserved under concurrent transfers from every node, read-only audits that never
//! abort, one winner among concurrent creators of a root, identical replicas.

use std::time::{Duration, Instant};

use atomos::{Cluster, Protocol, TRef, TxError};

fn cluster(n: usize) -> Cluster {
    Cluster::in_process(n, Protocol::Certify).expect("cluster starts")
}

/// Every replica's objects, as its store's snapshot holds them.
type Stores = Vec<Vec<(atomos::Key, u64, Option<Vec<u8>>)>>;

/// Waits until every replica applied the same log position, and returns the engines' objects.
fn settled(c: &Cluster) -> Stores {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let applied: Vec<u64> = c
            .ids()
            .iter()
            .map(|&id| c.node(id).unwrap().engine().applied())
            .collect();
        if applied.windows(2).all(|w| w[0] == w[1]) {
            return c
                .ids()
                .iter()
                .map(|&id| c.node(id).unwrap().engine().snapshot_objects().unwrap())
                .collect();
        }
        assert!(
            Instant::now() < deadline,
            "replicas never caught up: {applied:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn every_object_is_on_every_replica() {
    let c = cluster(3);
    let (n1, n2, n3) = (c.node(1).unwrap(), c.node(2).unwrap(), c.node(3).unwrap());
    let a: TRef<Vec<String>> = TRef::new("shared/list");
    n1.atomically(|tx| tx.create(&a, vec!["one".to_string()]))
        .unwrap();
    // A linearizable read on another replica sees the commit.
    assert_eq!(
        n2.tx()
            .linearizable()
            .read_only()
            .run(|tx| Ok(tx.read(&a)?.clone()))
            .unwrap(),
        vec!["one".to_string()]
    );
    n3.sync().unwrap();
    n3.atomically(|tx| tx.modify(&a, |l| l.push("three".into())))
        .unwrap();
    n1.sync().unwrap();
    assert_eq!(n1.atomically_read(|tx| Ok(tx.read(&a)?.len())).unwrap(), 2);
    let wrong: TRef<u64> = TRef::new("shared/list");
    assert!(matches!(
        n2.tx().linearizable().run(|tx| Ok(*tx.read(&wrong)?)),
        Err(TxError::WrongType { .. })
    ));
    assert!(matches!(
        n2.tx().linearizable().run(|tx| tx.create(&a, vec![])),
        Err(TxError::AlreadyExists { .. })
    ));
    assert!(matches!(
        n1.atomically_read(|tx| tx.modify(&a, |l| l.clear())),
        Err(TxError::WriteInReadOnly { .. })
    ));
    n2.atomically(|tx| tx.delete(&a)).unwrap();
    for n in [n1, n2, n3] {
        n.sync().unwrap();
        assert!(!n.atomically(|tx| tx.exists(&a)).unwrap());
    }
    n3.atomically(|tx| tx.create(&a, vec![])).unwrap();
    let stores = settled(&c);
    assert!(stores.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn transfers_from_every_replica_conserve_money_and_audits_never_abort() {
    let c = cluster(3);
    const ACCOUNTS: u64 = 20;
    let account = |i: u64| TRef::<i64>::new(atomos::Key::with_index("acct/", i));
    c.node(1)
        .unwrap()
        .atomically(|tx| {
            for i in 0..ACCOUNTS {
                tx.create(&account(i), 1_000)?;
            }
            Ok(())
        })
        .unwrap();
    for id in c.ids() {
        c.node(id).unwrap().sync().unwrap();
    }
    std::thread::scope(|s| {
        for id in c.ids() {
            for t in 0..2u64 {
                let node = c.node(id).unwrap().clone();
                s.spawn(move || {
                    let mut x = id * 31 + t + 1;
                    for _ in 0..150 {
                        x = x
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let (a, b) = ((x >> 33) % ACCOUNTS, (x >> 17) % ACCOUNTS);
                        if a != b {
                            node.atomically(|tx| {
                                tx.modify(&account(a), |v| *v -= 7)?;
                                tx.modify(&account(b), |v| *v += 7)
                            })
                            .unwrap();
                        }
                        let mut runs = 0;
                        let total: i64 = node
                            .atomically_read(|tx| {
                                runs += 1;
                                (0..ACCOUNTS).map(|i| tx.read(&account(i)).copied()).sum()
                            })
                            .unwrap();
                        assert_eq!(total, 1_000 * ACCOUNTS as i64);
                        assert_eq!(runs, 1, "a read-only audit was re-run");
                    }
                });
            }
        }
    });
    let stores = settled(&c);
    assert!(stores.windows(2).all(|w| w[0] == w[1]));
    for id in c.ids() {
        let stats = c.node(id).unwrap().stats();
        assert!(stats.read_only_commits >= 300, "{stats:?}");
    }
}

#[test]
fn concurrent_creators_of_a_root_get_one_winner() {
    let c = cluster(3);
    let root: TRef<u64> = TRef::new("registry/root");
    // Every creator reads the root as missing before any of them commits.
    let barrier = std::sync::Barrier::new(3);
    let results: Vec<Result<(), TxError>> = std::thread::scope(|s| {
        let handles: Vec<_> = c
            .ids()
            .into_iter()
            .map(|id| {
                let node = c.node(id).unwrap().clone();
                let (root, barrier) = (root.clone(), &barrier);
                s.spawn(move || {
                    let mut first = true;
                    node.atomically(|tx| {
                        tx.create(&root, id)?;
                        if std::mem::take(&mut first) {
                            barrier.wait();
                        }
                        Ok(())
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        results.iter().filter(|r| r.is_ok()).count(),
        1,
        "{results:?}"
    );
    assert!(results
        .iter()
        .all(|r| r.is_ok() || matches!(r, Err(TxError::AlreadyExists { .. }))));
    let stores = settled(&c);
    assert!(stores.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn abstract_locks_are_exclusive_across_replicas() {
    let c = cluster(2);
    let (n1, n2) = (c.node(1).unwrap(), c.node(2).unwrap());
    let (taken_tx, taken_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let holder = s.spawn(move || {
            n1.atomically(|tx| {
                tx.abstract_lock("slot")?;
                let _ = taken_tx.send(());
                let _ = go_rx.recv();
                Ok(())
            })
        });
        taken_rx.recv().unwrap();
        // Held on replica 1: replica 2's transactions conflict on it.
        let r = n2.tx().max_attempts(3).run(|tx| tx.abstract_lock("slot"));
        assert!(
            matches!(r, Err(TxError::RetryBudgetExhausted { .. })),
            "{r:?}"
        );
        go_tx.send(()).unwrap();
        holder.join().unwrap().unwrap();
    });
    // Released when the holder's transaction ended.
    n2.tx()
        .max_attempts(50)
        .run(|tx| tx.abstract_lock("slot"))
        .unwrap();
}

/// A list cell: anonymous objects linked through references.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, atomos::Object)]
#[atomos(name = "test.Cons")]
struct Cons {
    value: u64,
    next: Option<TRef<Cons>>,
}

/// The values of the list from `head`, read in one snapshot.
fn walk(node: &atomos::Node, head: &TRef<Option<TRef<Cons>>>) -> Result<Vec<u64>, TxError> {
    node.atomically_read(|tx| {
        let mut out = Vec::new();
        let mut at = tx.read(head)?.clone();
        while let Some(r) = at {
            let cell = tx.read(&r)?;
            out.push(cell.value);
            at = cell.next.clone();
        }
        Ok(out)
    })
}

#[test]
fn collection_reclaims_exactly_the_unreachable_objects_on_every_replica() {
    let c = cluster(3);
    let (n1, n2, n3) = (c.node(1).unwrap(), c.node(2).unwrap(), c.node(3).unwrap());
    let head: TRef<Option<TRef<Cons>>> = TRef::new("list/head");
    // head -> 0 -> 1 -> ... -> 19, all anonymous.
    let cells: Vec<TRef<Cons>> = n1
        .atomically(|tx| {
            let mut next = None;
            let mut made = Vec::new();
            for value in (0..20).rev() {
                let r = tx.new_object(Cons { value, next })?;
                made.push(r.clone());
                next = Some(r);
            }
            tx.create(&head, next)?;
            made.reverse();
            Ok(made)
        })
        .unwrap();
    // An anonymous object nothing ever referenced.
    let orphan = n2
        .atomically(|tx| {
            tx.new_object(Cons {
                value: 99,
                next: None,
            })
        })
        .unwrap();
    for n in [n1, n2, n3] {
        n.sync().unwrap();
        assert_eq!(walk(n, &head).unwrap(), (0..20).collect::<Vec<_>>());
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        // Readers walk the list the whole time: always whole, never a dangling reference.
        let readers: Vec<_> = [n2, n3]
            .into_iter()
            .map(|n| {
                let (head, stop) = (&head, &stop);
                s.spawn(move || {
                    let mut walks = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let values = walk(n, head).unwrap();
                        assert!(values.len() == 20 || values.len() == 10, "{values:?}");
                        walks += 1;
                    }
                    walks
                })
            })
            .collect();
        // Writers keep committing elsewhere.
        let counter: TRef<u64> = TRef::new("busy/counter");
        n3.atomically(|tx| tx.create(&counter, 0)).unwrap();
        let stop_writer = &stop;
        let writer = s.spawn(move || {
            let stop = stop_writer;
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n3.atomically(|tx| tx.modify(&counter, |c| *c += 1))
                    .unwrap();
                n += 1;
            }
            n
        });
        // Cut the list after 9: 10..19 are unreachable, and so is the orphan.
        n1.atomically(|tx| tx.modify(&cells[9], |c| c.next = None))
            .unwrap();
        let reclaimed = c.member(2).unwrap().collect().unwrap();
        assert!(reclaimed <= 11, "{reclaimed}");
        std::thread::sleep(Duration::from_millis(100));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for r in readers {
            assert!(r.join().unwrap() > 0);
        }
        assert!(writer.join().unwrap() > 0);
    });
    // Exactly the unreachable ones are gone, on every replica.
    for n in [n1, n2, n3] {
        n.sync().unwrap();
        let exists: Vec<bool> = n
            .atomically_read(|tx| cells.iter().map(|r| tx.exists(r)).collect())
            .unwrap();
        assert_eq!(exists, (0..20).map(|i| i < 10).collect::<Vec<_>>());
        assert!(!n.atomically_read(|tx| tx.exists(&orphan)).unwrap());
        assert_eq!(walk(n, &head).unwrap(), (0..10).collect::<Vec<_>>());
    }
    // Nothing is left to collect; named objects are never collected.
    assert_eq!(c.member(1).unwrap().collect().unwrap(), 0);
    let stores = settled(&c);
    assert!(stores.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn a_replica_cut_off_reports_its_commit_as_unknown_and_never_reruns_it() {
    let c = cluster(3);
    let (n1, n2) = (c.node(1).unwrap(), c.node(2).unwrap());
    let x: TRef<u64> = TRef::new("cut/x");
    n1.atomically(|tx| tx.create(&x, 0)).unwrap();
    n2.sync().unwrap();
    // Node 1 loses the cluster.
    let cut = atomos::net::transport::LinkRule {
        cut: true,
        ..Default::default()
    };
    let transport = c.member(1).unwrap().rpc().transport().unwrap();
    transport.faults().set_peer(2, cut);
    transport.faults().set_peer(3, cut);
    let mut runs = 0;
    let started = Instant::now();
    let out = n1.atomically(|tx| {
        runs += 1;
        tx.write(&x, 1)
    });
    assert!(
        matches!(out, Err(TxError::OutcomeUnknown { .. })),
        "{out:?}"
    );
    assert_eq!(runs, 1, "a commit of unknown outcome was run again");
    assert!(started.elapsed() < Duration::from_secs(30));
    // Its replica still answers reads from what it applied.
    assert_eq!(n1.atomically_read(|tx| Ok(*tx.read(&x)?)).unwrap(), 0);
    // The majority goes on without it.
    n2.atomically(|tx| tx.modify(&x, |v| *v += 10)).unwrap();
    assert_eq!(n2.atomically_read(|tx| Ok(*tx.read(&x)?)).unwrap(), 10);
}

/// A replica killed (its in-memory log lost with it) while the others commit, then restarted
/// empty: it rejoins, catches up from the others, and serves the same state; a killed node
/// cannot be killed twice, nor a running one restarted.
#[test]
fn a_killed_replica_restarts_empty_and_catches_up() {
    let mut c = cluster(3);
    let x: TRef<u64> = TRef::new("restart/x");
    c.node(1)
        .unwrap()
        .atomically(|tx| tx.create(&x, 0))
        .unwrap();
    c.kill(3).unwrap();
    assert!(c.node(3).is_none());
    assert!(c.kill(3).is_err());
    assert!(c.restart(2).is_err(), "node 2 runs");
    for _ in 0..50 {
        c.node(1)
            .unwrap()
            .atomically(|tx| tx.modify(&x, |v| *v += 1))
            .unwrap();
    }
    c.restart(3).unwrap();
    let n3 = c.node(3).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while n3.sync().is_err() {
        assert!(Instant::now() < deadline, "node 3 never caught up");
    }
    assert_eq!(n3.atomically_read(|tx| Ok(*tx.read(&x)?)).unwrap(), 50);
    n3.atomically(|tx| tx.modify(&x, |v| *v += 1)).unwrap();
    let stores = settled(&c);
    assert!(stores.windows(2).all(|w| w[0] == w[1]));
}
