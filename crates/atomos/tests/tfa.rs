//! The TFA protocol through the public API, on nodes in one process linked in memory: the same
//! application code as on a local node, objects migrating to their writers, the bank's money
//! conserved under concurrent transfers from every node, clear errors for unreachable objects.

use std::time::{Duration, Instant};

use atomos::net::transport::LinkRule;
use atomos::{Cluster, Protocol, TRef, TxError};

fn cluster(n: usize) -> Cluster {
    Cluster::in_process(n, Protocol::Tfa).expect("cluster starts")
}

#[test]
fn objects_are_shared_across_nodes_and_move_to_their_writer() {
    let c = cluster(3);
    let (n1, n2, n3) = (c.node(1).unwrap(), c.node(2).unwrap(), c.node(3).unwrap());
    let a: TRef<Vec<String>> = TRef::new("shared/list");
    n1.atomically(|tx| tx.create(&a, vec!["one".to_string()]))
        .unwrap();
    assert_eq!(
        n2.atomically(|tx| Ok(tx.read(&a)?.clone())).unwrap(),
        vec!["one".to_string()]
    );
    n3.atomically(|tx| tx.modify(&a, |l| l.push("three".into())))
        .unwrap();
    let owned = |id| c.member(id).unwrap().tfa().unwrap().objects_owned();
    assert!(owned(3) >= 1, "the writer owns the object now");
    assert_eq!(n1.atomically_read(|tx| Ok(tx.read(&a)?.len())).unwrap(), 2);
    // Typed errors travel too.
    let wrong: TRef<u64> = TRef::new("shared/list");
    assert!(matches!(
        n2.atomically(|tx| Ok(*tx.read(&wrong)?)),
        Err(TxError::WrongType { .. })
    ));
    assert!(matches!(
        n2.atomically(|tx| tx.create(&a, vec![])),
        Err(TxError::AlreadyExists { .. })
    ));
    assert!(matches!(
        n1.atomically_read(|tx| tx.modify(&a, |l| l.clear())),
        Err(TxError::WriteInReadOnly { .. })
    ));
    n2.atomically(|tx| tx.delete(&a)).unwrap();
    for n in [n1, n2, n3] {
        assert!(matches!(
            n.atomically(|tx| Ok(tx.read(&a)?.len())),
            Err(TxError::NotFound { .. })
        ));
        assert!(!n.atomically(|tx| tx.exists(&a)).unwrap());
    }
    // A deleted object can be created again, anywhere.
    n3.atomically(|tx| tx.create(&a, vec![])).unwrap();
}

#[test]
fn a_nested_block_that_fails_leaves_no_trace() {
    let c = cluster(2);
    let n1 = c.node(1).unwrap();
    let x: TRef<i64> = TRef::new("nested/x");
    n1.atomically(|tx| tx.create(&x, 1)).unwrap();
    let out = c
        .node(2)
        .unwrap()
        .atomically(|tx| {
            tx.write(&x, 2)?;
            let inner = tx.nested(|tx| {
                tx.write(&x, 3)?;
                Err::<(), _>(TxError::abort("inner gives up"))
            });
            assert!(inner.is_err());
            Ok(*tx.read(&x)?)
        })
        .unwrap();
    assert_eq!(out, 2);
    assert_eq!(n1.atomically(|tx| Ok(*tx.read(&x)?)).unwrap(), 2);
}

#[test]
fn concurrent_transfers_from_every_node_conserve_money() {
    const ACCOUNTS: u64 = 20;
    let c = cluster(3);
    let accounts: Vec<TRef<i64>> = (0..ACCOUNTS)
        .map(|i| TRef::new(format!("bank/{i}")))
        .collect();
    c.node(1)
        .unwrap()
        .atomically(|tx| {
            for a in &accounts {
                tx.create(a, 100)?;
            }
            Ok(())
        })
        .unwrap();
    std::thread::scope(|s| {
        for id in 1..=3u64 {
            for t in 0..2u64 {
                let node = c.node(id).unwrap().clone();
                let accounts = &accounts;
                s.spawn(move || {
                    let mut x = id * 7 + t * 13;
                    for _ in 0..150 {
                        x = x
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let from = (x >> 33) % ACCOUNTS;
                        let to = (from + 1 + (x >> 45) % (ACCOUNTS - 1)) % ACCOUNTS;
                        if x % 4 == 0 {
                            let total = node
                                .atomically_read(|tx| {
                                    let mut sum = 0;
                                    for a in accounts {
                                        sum += *tx.read(a)?;
                                    }
                                    Ok(sum)
                                })
                                .unwrap();
                            assert_eq!(total, 100 * ACCOUNTS as i64, "an audit saw money move");
                        } else {
                            node.atomically(|tx| {
                                tx.modify(&accounts[from as usize], |b| *b -= 5)?;
                                tx.modify(&accounts[to as usize], |b| *b += 5)
                            })
                            .unwrap();
                        }
                    }
                });
            }
        }
    });
    for id in 1..=3 {
        let total: i64 = c
            .node(id)
            .unwrap()
            .atomically_read(|tx| {
                let mut sum = 0;
                for a in &accounts {
                    sum += *tx.read(a)?;
                }
                Ok(sum)
            })
            .unwrap();
        assert_eq!(total, 100 * ACCOUNTS as i64);
    }
    let held: usize = (1..=3)
        .map(|id| c.member(id).unwrap().tfa().unwrap().locks_held())
        .sum();
    assert_eq!(held, 0);
    let stats = c.node(1).unwrap().stats();
    assert!(stats.commits > 0);
}

#[test]
fn an_unreachable_owner_fails_with_the_object_and_node_named() {
    let c = cluster(2);
    let x: TRef<i64> = TRef::new("far/x");
    c.node(2)
        .unwrap()
        .atomically(|tx| tx.create(&x, 1))
        .unwrap();
    // Cut node 1 off from node 2.
    let cut = LinkRule {
        cut: true,
        ..LinkRule::default()
    };
    c.member(1)
        .unwrap()
        .rpc()
        .transport()
        .unwrap()
        .faults()
        .set_peer(2, cut);
    let started = Instant::now();
    let err = c
        .node(1)
        .unwrap()
        .atomically(|tx| Ok(*tx.read(&x)?))
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "it never hangs"
    );
    match &err {
        TxError::Unavailable { key, node } => {
            assert_eq!(key.to_string(), x.key().to_string());
            assert_eq!(*node, 2);
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
    assert!(err.to_string().contains("node 2 did not answer"), "{err}");

    // The same from a fiber on the cluster's runtime: its wait has the same deadline.
    let node = c.node(1).unwrap().clone();
    let reader = x.clone();
    // SAFETY: the closure holds nothing tied to a thread.
    let fiber = unsafe { atomos::Fiber::new(move || node.atomically(|tx| Ok(*tx.read(&reader)?))) }
        .expect("a stack for the fiber");
    let started = Instant::now();
    let err = c
        .block_on(async { tokio::spawn(fiber).await })
        .expect("no panic")
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "it never hangs"
    );
    assert!(
        matches!(err, TxError::Unavailable { node: 2, .. }),
        "expected unavailable, got {err:?}"
    );
}

/// Runs `body` on node 1 while node 2 writes `changed` (and `trigger`, whose newer version
/// makes node 1's next read forward) at the moment `body` signals.
struct Interleaving {
    go: std::sync::mpsc::Sender<()>,
    done: std::sync::mpsc::Receiver<()>,
}

impl Interleaving {
    /// Lets node 2 write and waits until it committed.
    fn write_now(&self) {
        self.go.send(()).unwrap();
        self.done.recv().unwrap();
    }
}

fn with_writer<R>(
    c: &Cluster,
    changed: &TRef<i64>,
    trigger: &TRef<i64>,
    body: impl FnOnce(&Interleaving) -> R,
) -> R {
    let (go, go_rx) = std::sync::mpsc::channel();
    let (done_tx, done) = std::sync::mpsc::channel();
    let n2 = c.node(2).unwrap().clone();
    std::thread::scope(|s| {
        s.spawn(move || {
            go_rx.recv().unwrap();
            n2.atomically(|tx| {
                tx.modify(changed, |v| *v += 10)?;
                tx.modify(trigger, |v| *v += 10)
            })
            .unwrap();
            done_tx.send(()).unwrap();
        });
        body(&Interleaving { go, done })
    })
}

fn three_objects(c: &Cluster, name: &str) -> (TRef<i64>, TRef<i64>, TRef<i64>) {
    let refs = (
        TRef::new(format!("{name}/x")),
        TRef::new(format!("{name}/y")),
        TRef::new(format!("{name}/z")),
    );
    c.node(2)
        .unwrap()
        .atomically(|tx| {
            tx.create(&refs.0, 1)?;
            tx.create(&refs.1, 1)?;
            tx.create(&refs.2, 1)
        })
        .unwrap();
    refs
}

#[test]
fn a_stale_read_inside_a_nested_block_reruns_only_the_block() {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    let c = cluster(2);
    let (x, y, z) = three_objects(&c, "tfacn");
    let n1 = c.node(1).unwrap();
    let (parent_runs, block_runs) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let before = n1.stats();
    let out = with_writer(&c, &y, &z, |w| {
        n1.atomically(|tx| {
            parent_runs.fetch_add(1, Relaxed);
            let a = *tx.read(&x)?;
            let b = tx.nested(|tx| {
                let yv = *tx.read(&y)?;
                if block_runs.fetch_add(1, Relaxed) == 0 {
                    // y and z change now: reading z forwards, and y is stale.
                    w.write_now();
                }
                Ok(yv + *tx.read(&z)?)
            })?;
            Ok(a + b)
        })
        .unwrap()
    });
    assert_eq!(out, 1 + 11 + 11);
    assert_eq!(parent_runs.load(Relaxed), 1, "the parent was not re-run");
    assert_eq!(block_runs.load(Relaxed), 2, "the block was");
    assert_eq!(n1.stats().since(&before).nested_rollbacks, 1);
}

#[test]
fn a_stale_read_of_the_parent_reruns_the_whole_transaction() {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    let c = cluster(2);
    let (x, _, z) = three_objects(&c, "tfacn-parent");
    let n1 = c.node(1).unwrap();
    let parent_runs = AtomicUsize::new(0);
    let out = with_writer(&c, &x, &z, |w| {
        n1.atomically(|tx| {
            let first = parent_runs.fetch_add(1, Relaxed) == 0;
            let a = *tx.read(&x)?;
            tx.nested(|tx| {
                if first {
                    w.write_now();
                }
                Ok(a + *tx.read(&z)?)
            })
        })
        .unwrap()
    });
    assert_eq!(out, 11 + 11);
    assert_eq!(parent_runs.load(Relaxed), 2);
}

#[test]
fn checkpointed_steps_resume_after_the_last_valid_checkpoint() {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    let c = cluster(2);
    let (x, y, z) = three_objects(&c, "tfacp");
    let n1 = c.node(1).unwrap();
    let (first_runs, second_runs) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let before = n1.stats();
    let total = with_writer(&c, &y, &z, |w| {
        n1.steps(0i64)
            .step(|tx, sum| {
                first_runs.fetch_add(1, Relaxed);
                *sum += *tx.read(&x)?;
                Ok(())
            })
            .step(|tx, sum| {
                *sum += *tx.read(&y)?;
                if second_runs.fetch_add(1, Relaxed) == 0 {
                    w.write_now();
                }
                *sum += *tx.read(&z)?;
                Ok(())
            })
            .run()
            .unwrap()
    });
    assert_eq!(total, 1 + 11 + 11);
    assert_eq!(
        first_runs.load(Relaxed),
        1,
        "the first step kept its checkpoint"
    );
    assert_eq!(second_runs.load(Relaxed), 2);
    assert_eq!(n1.stats().since(&before).checkpoint_resumes, 1);
}

#[test]
fn open_nesting_commits_early_holds_abstract_locks_and_compensates() {
    let c = cluster(2);
    let (n1, n2) = (c.node(1).unwrap(), c.node(2).unwrap());
    let counter: TRef<i64> = TRef::new("open/counter");
    n2.atomically(|tx| tx.create(&counter, 0)).unwrap();
    let out = n1.atomically(|tx| {
        tx.open_nested(|tx| {
            tx.abstract_lock("open/counter")?;
            tx.modify(&counter, |v| *v += 1)?;
            let undo = counter.clone();
            tx.on_abort(move |tx| tx.modify(&undo, |v| *v -= 1));
            Ok(())
        })?;
        // The block committed on its own: another node sees it while this one still runs.
        assert_eq!(n2.atomically(|tx| Ok(*tx.read(&counter)?)).unwrap(), 1);
        // Its abstract lock is held (on the lock's home): another family's open block that
        // wants it aborts its parent, every time.
        let blocked = n2
            .tx()
            .max_attempts(3)
            .run(|tx| tx.open_nested(|tx| tx.abstract_lock("open/counter")));
        assert!(
            matches!(blocked, Err(TxError::RetryBudgetExhausted { .. })),
            "{blocked:?}"
        );
        Err::<(), _>(TxError::abort("the outer transaction gives up"))
    });
    assert!(out.is_err());
    // The compensation ran, and the lock is free again.
    assert_eq!(n2.atomically(|tx| Ok(*tx.read(&counter)?)).unwrap(), 0);
    n2.atomically(|tx| tx.open_nested(|tx| tx.abstract_lock("open/counter")))
        .unwrap();
    let held: usize = (1..=2)
        .map(|id| c.member(id).unwrap().tfa().unwrap().abstract_locks_held())
        .sum();
    assert_eq!(held, 0, "released at the end of each outer transaction");
}

#[test]
fn checkpointed_steps_resume_after_a_failed_commit() {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    let c = cluster(2);
    let (x, y, z) = three_objects(&c, "tfacp-commit");
    let unrelated: TRef<i64> = TRef::new("tfacp-commit/t");
    c.node(2)
        .unwrap()
        .atomically(|tx| tx.create(&unrelated, 1))
        .unwrap();
    let n1 = c.node(1).unwrap();
    let (first_runs, second_runs) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let before = n1.stats();
    let written = with_writer(&c, &y, &unrelated, |w| {
        n1.steps(0i64)
            .step(|tx, _| {
                first_runs.fetch_add(1, Relaxed);
                tx.read(&x)?;
                Ok(())
            })
            .step(|tx, out| {
                let yv = *tx.read(&y)?;
                if second_runs.fetch_add(1, Relaxed) == 0 {
                    // y changes before the commit: validation at commit finds it stale.
                    w.write_now();
                }
                *out = tx.modify(&z, |v| {
                    *v += yv;
                    *v
                })?;
                Ok(())
            })
            .run()
            .unwrap()
    });
    assert_eq!(written, 1 + 11, "the second step re-ran with the new y");
    assert_eq!(
        first_runs.load(Relaxed),
        1,
        "the first step kept its checkpoint"
    );
    assert_eq!(second_runs.load(Relaxed), 2);
    assert_eq!(n1.stats().since(&before).checkpoint_resumes, 1);
    assert_eq!(
        c.node(2)
            .unwrap()
            .atomically(|tx| Ok(*tx.read(&z)?))
            .unwrap(),
        12
    );
}

/// Under TFA an object has one current copy and no old versions, so a read-only transaction
/// reads each object from its owner: when one it read changes before it finishes, it is
/// re-run (never shown an inconsistent state), unlike under `local`, where it reads a
/// snapshot and never re-runs.
#[test]
fn a_read_only_transaction_under_tfa_is_rerun_when_what_it_read_changes() {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    let c = cluster(2);
    let (x, _, z) = three_objects(&c, "tfa-read-only");
    let n1 = c.node(1).unwrap();
    let runs = AtomicUsize::new(0);
    let before = n1.stats();
    let total = with_writer(&c, &x, &z, |w| {
        n1.atomically_read(|tx| {
            let a = *tx.read(&x)?;
            if runs.fetch_add(1, Relaxed) == 0 {
                // x and z change now: reading z finds a newer version, and x is stale.
                w.write_now();
            }
            Ok(a + *tx.read(&z)?)
        })
        .unwrap()
    });
    assert_eq!(total, 11 + 11, "a consistent snapshot, after the re-run");
    assert_eq!(runs.load(Relaxed), 2);
    let after = n1.stats().since(&before);
    assert_eq!(after.read_only_commits, 1);
    assert!(after.aborts.total() >= 1);
}
