//! Linked transactions through the public API: a chain's transactions see the writes of those
//! still committing, commit in program order with a queue of one, lose no update when chains
//! on several nodes conflict (cascading aborts re-run them), and behave as plain transactions
//! where commits are local.

use atomos::{Cluster, Node, Protocol, TRef, TxError};

fn counter(name: &str) -> TRef<u64> {
    TRef::new(name)
}

/// Creates `names` at 0 on `node` and brings every node of `c` up to date.
fn create(c: &Cluster, node: &Node, names: &[&str]) {
    node.atomically(|tx| {
        for n in names {
            tx.create(&counter(n), 0)?;
        }
        Ok(())
    })
    .unwrap();
    for id in c.ids() {
        c.node(id).unwrap().sync().unwrap();
    }
}

fn read(node: &Node, name: &str) -> u64 {
    node.sync().unwrap();
    node.atomically_read(|tx| Ok(*tx.read(&counter(name))?))
        .unwrap()
}

/// A chain of `n` increments of counter `name` on `node` (a queue of one): the values the
/// increments committed with.
fn increments(node: &Node, name: &'static str, n: u64) -> Vec<u64> {
    let mut chain = node.linked(1);
    let handles: Vec<_> = (0..n)
        .map(|_| {
            chain
                .run(move |tx| {
                    tx.modify(&counter(name), |v| {
                        *v += 1;
                        *v
                    })
                })
                .unwrap()
        })
        .collect();
    chain.finish().unwrap();
    handles.into_iter().map(|h| h.wait().unwrap()).collect()
}

/// One chain incrementing one counter: each transaction sees the increments still being
/// committed, and the handles give 1, 2, 3, ... as committed.
fn a_chain_sees_its_own_outstanding_writes(protocol: Protocol) {
    let c = Cluster::in_process(3, protocol).expect("cluster starts");
    let node = c.node(2).unwrap().clone();
    create(&c, &node, &["c"]);
    let values = increments(&node, "c", 40);
    assert_eq!(values, (1..=40).collect::<Vec<u64>>(), "{protocol}");
    for id in c.ids() {
        assert_eq!(read(c.node(id).unwrap(), "c"), 40, "{protocol} node {id}");
    }
}

#[test]
fn a_chain_sees_its_own_outstanding_writes_under_oss() {
    a_chain_sees_its_own_outstanding_writes(Protocol::Oss);
}

#[test]
fn a_chain_sees_its_own_outstanding_writes_under_certify() {
    a_chain_sees_its_own_outstanding_writes(Protocol::Certify);
}

/// Chains on every node increment one shared counter: their commits conflict, the losers
/// and the transactions that saw their writes run again, and no increment is lost or
/// counted twice; each chain's values grow.
#[test]
fn conflicting_chains_lose_no_update() {
    let c = Cluster::in_process(3, Protocol::Oss).expect("cluster starts");
    create(&c, c.node(1).unwrap(), &["shared"]);
    let per_chain = 30u64;
    let threads: Vec<_> = c
        .ids()
        .into_iter()
        .map(|id| {
            let node = c.node(id).unwrap().clone();
            std::thread::spawn(move || increments(&node, "shared", per_chain))
        })
        .collect();
    let mut all = Vec::new();
    for t in threads {
        let values = t.join().unwrap();
        assert!(
            values.windows(2).all(|w| w[0] < w[1]),
            "a chain's values go back: {values:?}"
        );
        all.extend(values);
    }
    all.sort_unstable();
    let expected: Vec<u64> = (1..=3 * per_chain).collect();
    assert_eq!(
        all, expected,
        "every increment committed once, with its own value"
    );
    for id in c.ids() {
        assert_eq!(read(c.node(id).unwrap(), "shared"), 3 * per_chain);
    }
}

/// With a longer queue, transactions on different objects are all outstanding at once and
/// all commit.
#[test]
fn independent_transactions_fill_a_longer_queue() {
    let c = Cluster::in_process(3, Protocol::Oss).expect("cluster starts");
    let names = ["a", "b", "c", "d"];
    create(&c, c.node(1).unwrap(), &names);
    let node = c.node(3).unwrap().clone();
    let mut chain = node.linked(4);
    let mut handles = Vec::new();
    for round in 0..10 {
        for n in names {
            handles.push(
                chain
                    .run(move |tx| tx.modify(&counter(n), |v| *v += 1))
                    .unwrap(),
            );
        }
        let _ = round;
    }
    chain.finish().unwrap();
    for h in handles {
        h.wait().unwrap();
    }
    for n in names {
        assert_eq!(read(&node, n), 10);
    }
}

/// Where commits are local there is nothing to hide: each transaction commits in `run`.
#[test]
fn local_commits_run_as_plain_transactions() {
    let node = Node::new(Default::default());
    node.atomically(|tx| tx.create(&counter("c"), 0)).unwrap();
    let mut chain = node.linked(1);
    let h = chain
        .run(|tx| {
            tx.modify(&counter("c"), |v| {
                *v += 5;
                *v
            })
        })
        .unwrap();
    assert!(h.is_ready());
    assert_eq!(h.wait().unwrap(), 5);
    // An error of the body is the caller's, at once.
    let missing = chain.run(|tx| tx.modify(&counter("nothing"), |v| *v += 1));
    let err = missing.and_then(|h| h.wait());
    assert!(matches!(err, Err(TxError::NotFound { .. })), "{err:?}");
}

/// Opacity across the chain: a linked transaction never sees an outstanding commit's write
/// next to a newer value of what that commit read. Node 1's chain keeps setting `x` to `y`;
/// node 2 keeps lowering `y` (and `x` with it, so that `x <= y` always holds). A transaction
/// of the chain that saw the chain's `x` beside node 2's newer `y` would find `x > y`.
#[test]
fn a_chain_never_sees_its_writes_beside_newer_values_of_what_they_read() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let c = Cluster::in_process(2, Protocol::Oss).expect("cluster starts");
    let n1 = c.node(1).unwrap().clone();
    n1.atomically(|tx| {
        tx.create(&counter("x"), 0)?;
        tx.create(&counter("y"), 1_000_000)
    })
    .unwrap();
    for id in c.ids() {
        c.node(id).unwrap().sync().unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let lowered = Arc::new(AtomicU64::new(0));
    let lowering = {
        let (n2, stop, lowered) = (c.node(2).unwrap().clone(), stop.clone(), lowered.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                n2.atomically(|tx| {
                    let y = *tx.read(&counter("y"))? - 1;
                    let x = (*tx.read(&counter("x"))?).min(y);
                    tx.write(&counter("y"), y)?;
                    tx.write(&counter("x"), x)
                })
                .unwrap();
                lowered.fetch_add(1, Ordering::Relaxed);
                // Room for the chain's commits, which conflict with these.
                std::thread::sleep(std::time::Duration::from_millis(3));
            }
        })
    };
    let inconsistent = Arc::new(AtomicU64::new(0));
    // Reads `x` and `y`, counting a view where `x > y`; returns `y`.
    let look = |seen: &AtomicU64, tx: &mut atomos::Tx<'_>| -> Result<u64, TxError> {
        let x = *tx.read(&counter("x"))?;
        let y = *tx.read(&counter("y"))?;
        if x > y {
            seen.fetch_add(1, Ordering::Relaxed);
        }
        Ok(y)
    };
    let mut chain = n1.linked(1);
    for _ in 0..60 {
        let seen = inconsistent.clone();
        chain
            .run(move |tx| {
                let y = look(&seen, tx)?;
                tx.write(&counter("x"), y)
            })
            .unwrap();
        // Another transaction that reads both, over the chain's write of `x`.
        let seen = inconsistent.clone();
        chain
            .run(move |tx| {
                look(&seen, tx)?;
                Ok(())
            })
            .unwrap();
    }
    chain.finish().unwrap();
    stop.store(true, Ordering::Relaxed);
    lowering.join().unwrap();
    assert!(
        lowered.load(Ordering::Relaxed) > 0,
        "node 2 never committed"
    );
    assert_eq!(
        inconsistent.load(Ordering::Relaxed),
        0,
        "a linked transaction saw x > y"
    );
}

/// Runs `f` on a thread of its own and fails if it takes more than a minute (a wait that
/// blocked a runtime thread would stop the run instead of failing it).
fn within_a_minute<R: Send + 'static>(what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // The receiver is gone only if it gave up waiting.
        let _ = tx.send(f());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok(r) => r,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("{what}: no result in 60 s"),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: it panicked"),
    }
}

/// Chains run in fibers on the cluster's runtime, more of them than it has threads: a fiber
/// waiting for its chain's oldest commit, or for a handle, suspends while the runtime goes on
/// deciding the commits. On one shared counter no increment is lost and each chain's values
/// grow; on counters of their own, each fiber waits on every handle while its commit is still
/// on its way.
#[test]
fn chains_in_fibers_lose_no_update_and_wait_on_their_handles() {
    for protocol in [Protocol::Oss, Protocol::Certify] {
        within_a_minute(&format!("{protocol}"), move || chains_in_fibers(protocol));
    }
}

fn chains_in_fibers(protocol: Protocol) {
    let c = Cluster::in_process(3, protocol).expect("cluster starts");
    let first = c.node(1).unwrap().clone();
    let own: Vec<String> = (0..9).map(|i| format!("own/{i}")).collect();
    let mut names = vec!["shared"];
    names.extend(own.iter().map(String::as_str));
    create(&c, &first, &names);
    let per_chain = 15u64;
    let fibers: Vec<_> = c
        .ids()
        .into_iter()
        .flat_map(|id| (0..3).map(move |k| (id, k)))
        .zip(own.clone())
        .map(|((id, k), mine)| {
            let node = c.node(id).unwrap().clone();
            // SAFETY: the chains hold nothing tied to a thread across their waits.
            unsafe {
                atomos::Fiber::new(move || {
                    let shared = increments(&node, "shared", per_chain);
                    // Each handle waited on right after its `run`: with nothing else touching
                    // the counter, its commit cannot conflict, so nothing runs it again later.
                    let mut chain = node.linked(1 + k);
                    let mine_values: Vec<u64> = (0..per_chain)
                        .map(|_| {
                            let name = mine.clone();
                            chain
                                .run(move |tx| {
                                    tx.modify(&counter(&name), |v| {
                                        *v += 1;
                                        *v
                                    })
                                })
                                .unwrap()
                                .wait()
                                .unwrap()
                        })
                        .collect();
                    chain.finish().unwrap();
                    (shared, mine_values)
                })
            }
            .expect("a stack for the fiber")
        })
        .collect();
    let chains = fibers.len() as u64;
    let values: Vec<(Vec<u64>, Vec<u64>)> = c.block_on(async {
        let tasks: Vec<_> = fibers.into_iter().map(tokio::spawn).collect();
        let mut values = Vec::new();
        for t in tasks {
            values.push(t.await.expect("no panic"));
        }
        values
    });
    for (shared, mine) in &values {
        assert_eq!(shared.len() as u64, per_chain, "{protocol}");
        assert!(
            shared.windows(2).all(|w| w[0] < w[1]),
            "{protocol}: {shared:?}"
        );
        assert_eq!(mine, &(1..=per_chain).collect::<Vec<u64>>(), "{protocol}");
    }
    for id in c.ids() {
        let node = c.node(id).unwrap();
        assert_eq!(
            read(node, "shared"),
            chains * per_chain,
            "{protocol} node {id}"
        );
        for name in &own {
            assert_eq!(read(node, name), per_chain, "{protocol} node {id} {name}");
        }
    }
}
