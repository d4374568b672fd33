//! The transactional API, one behaviour at a time, including every error case.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use atomos::{Node, TRef, TxError};

fn node_with(pairs: &[(&str, i64)]) -> Node {
    let node = Node::local();
    node.atomically(|tx| {
        for (k, v) in pairs {
            tx.create(&TRef::<i64>::new(*k), *v)?;
        }
        Ok(())
    })
    .unwrap();
    node
}

#[test]
fn create_read_write_modify_delete_exists() {
    let node = Node::local();
    let r: TRef<String> = TRef::new("greeting");
    assert!(!node.atomically(|tx| tx.exists(&r)).unwrap());
    node.atomically(|tx| tx.create(&r, "hello".to_string()))
        .unwrap();
    assert_eq!(
        node.atomically(|tx| Ok(tx.read(&r)?.clone())).unwrap(),
        "hello"
    );
    node.atomically(|tx| tx.write(&r, "bye".to_string()))
        .unwrap();
    let len = node
        .atomically(|tx| {
            tx.modify(&r, |s| {
                s.push('!');
                s.len()
            })
        })
        .unwrap();
    assert_eq!(len, 4);
    assert_eq!(
        node.atomically_read(|tx| Ok(tx.read(&r)?.clone())).unwrap(),
        "bye!"
    );
    node.atomically(|tx| tx.delete(&r)).unwrap();
    assert!(!node.atomically(|tx| tx.exists(&r)).unwrap());
    // Created again after deletion.
    node.atomically(|tx| tx.create(&r, "again".to_string()))
        .unwrap();
    assert!(node.atomically_read(|tx| tx.exists(&r)).unwrap());
}

#[test]
fn reads_see_own_writes_and_nothing_leaks_on_abort() {
    let node = node_with(&[("x", 1)]);
    let x: TRef<i64> = TRef::new("x");
    let err = node
        .atomically(|tx| {
            tx.write(&x, 5)?;
            assert_eq!(*tx.read(&x)?, 5);
            tx.delete(&x)?;
            assert!(!tx.exists(&x)?);
            Err::<(), _>(TxError::abort("changed my mind"))
        })
        .unwrap_err();
    assert_eq!(err.to_string(), "changed my mind");
    assert_eq!(node.atomically_read(|tx| Ok(*tx.read(&x)?)).unwrap(), 1);
}

#[test]
fn missing_objects_are_typed_errors() {
    let node = Node::local();
    let r: TRef<u32> = TRef::new("nothing here");
    assert!(matches!(
        node.atomically(|tx| tx.read(&r).copied()),
        Err(TxError::NotFound { .. })
    ));
    assert!(matches!(
        node.atomically(|tx| tx.write(&r, 1)),
        Err(TxError::NotFound { .. })
    ));
    assert!(matches!(
        node.atomically(|tx| tx.modify(&r, |v| *v += 1)),
        Err(TxError::NotFound { .. })
    ));
    assert!(matches!(
        node.atomically(|tx| tx.delete(&r)),
        Err(TxError::NotFound { .. })
    ));
    node.atomically(|tx| tx.create(&r, 1)).unwrap();
    assert!(matches!(
        node.atomically(|tx| tx.create(&r, 2)),
        Err(TxError::AlreadyExists { .. })
    ));
}

#[test]
fn wrong_type_is_a_typed_error_and_changes_nothing() {
    let node = node_with(&[("n", 7)]);
    let as_string: TRef<String> = TRef::new("n");
    match node.atomically(|tx| tx.read(&as_string).cloned()) {
        Err(TxError::WrongType { key, expected }) => {
            assert_eq!(key, "n".into());
            assert!(expected.contains("String"));
        }
        other => panic!("expected WrongType, got {other:?}"),
    }
    assert!(matches!(
        node.atomically(|tx| tx.write(&as_string, "x".into())),
        Err(TxError::WrongType { .. })
    ));
    assert_eq!(
        node.atomically_read(|tx| Ok(*tx.read(&TRef::<i64>::new("n"))?))
            .unwrap(),
        7
    );
}

#[test]
fn writes_in_read_only_transactions_are_errors() {
    let node = node_with(&[("x", 1)]);
    let x: TRef<i64> = TRef::new("x");
    assert!(matches!(
        node.atomically_read(|tx| tx.write(&x, 2)),
        Err(TxError::WriteInReadOnly { .. })
    ));
    assert_eq!(node.atomically_read(|tx| Ok(*tx.read(&x)?)).unwrap(), 1);
}

#[derive(Debug, PartialEq)]
enum AppError {
    Tx(String),
    Insufficient { have: i64 },
}
impl From<TxError> for AppError {
    fn from(e: TxError) -> Self {
        AppError::Tx(e.to_string())
    }
}

#[test]
fn application_errors_reach_the_caller_unchanged_and_are_not_retried() {
    let node = node_with(&[("acct", 10)]);
    let acct: TRef<i64> = TRef::new("acct");
    let runs = AtomicUsize::new(0);
    let out: Result<(), AppError> = node.try_atomically(|tx| {
        runs.fetch_add(1, Ordering::Relaxed);
        let have = *tx.read(&acct)?;
        tx.write(&acct, have - 50)?;
        if have < 50 {
            return Err(AppError::Insufficient { have });
        }
        Ok(())
    });
    assert_eq!(out, Err(AppError::Insufficient { have: 10 }));
    assert_eq!(runs.load(Ordering::Relaxed), 1);
    assert_eq!(node.atomically_read(|tx| Ok(*tx.read(&acct)?)).unwrap(), 10);
    assert_eq!(node.stats().user_aborts, 1);
}

#[test]
fn retry_budget_exhausted_is_reported() {
    let node = node_with(&[("x", 0)]);
    let x: TRef<i64> = TRef::new("x");
    let other = node.clone();
    let out = node.tx().max_attempts(3).run(|tx| {
        let v = *tx.read(&x)?;
        // Make our read stale on every attempt.
        thread::scope(|s| {
            s.spawn(|| other.atomically(|tx| tx.modify(&x, |v| *v += 1)).unwrap());
        });
        tx.write(&x, v + 100)
    });
    assert!(
        matches!(out, Err(TxError::RetryBudgetExhausted { attempts: 3 })),
        "{out:?}"
    );
}

#[test]
fn timeout_is_reported() {
    let node = node_with(&[("x", 0)]);
    let x: TRef<i64> = TRef::new("x");
    let start = Instant::now();
    let out = node.tx().timeout(Duration::from_millis(100)).run(|tx| {
        if *tx.read(&x)? == 0 {
            return tx.retry();
        }
        Ok(())
    });
    assert!(matches!(out, Err(TxError::Timeout { .. })), "{out:?}");
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(100) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
}

#[test]
fn retry_blocks_until_a_read_object_changes() {
    let node = node_with(&[("queue", 0)]);
    let q: TRef<i64> = TRef::new("queue");
    let barrier = Arc::new(Barrier::new(2));
    let consumer = {
        let node = node.clone();
        let q = q.clone();
        let barrier = barrier.clone();
        thread::spawn(move || {
            barrier.wait();
            node.tx().timeout(Duration::from_secs(20)).run(|tx| {
                let n = *tx.read(&q)?;
                if n == 0 {
                    return tx.retry();
                }
                tx.write(&q, n - 1)?;
                Ok(n)
            })
        })
    };
    barrier.wait();
    thread::sleep(Duration::from_millis(50));
    node.atomically(|tx| tx.write(&q, 3)).unwrap();
    assert_eq!(consumer.join().unwrap().unwrap(), 3);
    assert_eq!(node.atomically_read(|tx| Ok(*tx.read(&q)?)).unwrap(), 2);
    assert!(node.stats().retry_waits >= 1);
}

#[test]
fn closed_nesting_rolls_back_only_the_inner_block_on_error() {
    let node = node_with(&[("a", 0), ("b", 0)]);
    let (a, b): (TRef<i64>, TRef<i64>) = (TRef::new("a"), TRef::new("b"));
    node.atomically(|tx| {
        tx.write(&a, 1)?;
        let inner = tx.nested(|tx| {
            tx.write(&a, 2)?;
            tx.write(&b, 2)?;
            Err::<(), _>(TxError::abort("inner fails"))
        });
        assert!(inner.is_err());
        assert_eq!(*tx.read(&a)?, 1, "the inner write to a is undone");
        assert_eq!(*tx.read(&b)?, 0, "the inner write to b is undone");
        tx.nested(|tx| tx.write(&b, 3))
    })
    .unwrap();
    let got = node
        .atomically_read(|tx| Ok((*tx.read(&a)?, *tx.read(&b)?)))
        .unwrap();
    assert_eq!(got, (1, 3));
}

#[test]
fn closed_nesting_reruns_only_the_inner_block_on_conflict() {
    let node = node_with(&[("outer", 0), ("inner", 0)]);
    let (o, i): (TRef<i64>, TRef<i64>) = (TRef::new("outer"), TRef::new("inner"));
    let outer_runs = AtomicUsize::new(0);
    let inner_runs = AtomicUsize::new(0);
    let other = node.clone();
    node.atomically(|tx| {
        outer_runs.fetch_add(1, Ordering::Relaxed);
        let base = *tx.read(&o)?;
        tx.nested(|tx| {
            let n = inner_runs.fetch_add(1, Ordering::Relaxed);
            let v = *tx.read(&i)?;
            if n == 0 {
                // Someone else changes what only the inner block read, then the inner block
                // reads again: its snapshot can no longer be extended past the change.
                thread::scope(|s| {
                    s.spawn(|| other.atomically(|tx| tx.write(&i, 10)).unwrap());
                });
                let _ = tx.read(&o)?;
                thread::scope(|s| {
                    s.spawn(|| other.atomically(|tx| tx.write(&i, 20)).unwrap());
                });
                tx.write(&i, v + 1)?;
                return tx.read(&i).map(|_| ());
            }
            tx.write(&i, v + base + 1)
        })
    })
    .unwrap();
    assert_eq!(
        outer_runs.load(Ordering::Relaxed),
        1,
        "the outer block ran once"
    );
    assert_eq!(
        inner_runs.load(Ordering::Relaxed),
        2,
        "the inner block re-ran"
    );
    assert_eq!(node.atomically_read(|tx| Ok(*tx.read(&i)?)).unwrap(), 21);
    assert_eq!(node.stats().nested_rollbacks, 1);
}

#[test]
fn open_nesting_commits_early_and_compensates_on_outer_abort() {
    let node = node_with(&[("stock", 10), ("log", 0)]);
    let (stock, log): (TRef<i64>, TRef<i64>) = (TRef::new("stock"), TRef::new("log"));
    let out = node.atomically(|tx| {
        tx.open_nested(|tx| {
            tx.abstract_lock("item-7")?;
            tx.modify(&stock, |s| *s -= 1)?;
            let stock = stock.clone();
            tx.on_abort(move |tx| tx.modify(&stock, |s| *s += 1));
            let log = log.clone();
            tx.on_commit(move |tx| tx.modify(&log, |l| *l += 1));
            Ok(())
        })?;
        // Visible to others at once, before the outer transaction ends.
        assert!(tx.engine().abstract_lock_held("item-7"));
        Err::<(), _>(TxError::abort("payment refused"))
    });
    assert!(out.is_err());
    let (s, l) = node
        .atomically_read(|tx| Ok((*tx.read(&stock)?, *tx.read(&log)?)))
        .unwrap();
    assert_eq!(
        (s, l),
        (10, 0),
        "compensation ran, on-commit action did not"
    );
    assert!(!node.engine().abstract_lock_held("item-7"));

    node.atomically(|tx| {
        tx.open_nested(|tx| {
            tx.abstract_lock("item-7")?;
            tx.modify(&stock, |s| *s -= 1)?;
            let log = log.clone();
            tx.on_commit(move |tx| tx.modify(&log, |l| *l += 1));
            Ok(())
        })
    })
    .unwrap();
    let (s, l) = node
        .atomically_read(|tx| Ok((*tx.read(&stock)?, *tx.read(&log)?)))
        .unwrap();
    assert_eq!((s, l), (9, 1));
    assert!(!node.engine().abstract_lock_held("item-7"));
}

#[test]
fn abstract_lock_held_elsewhere_aborts_the_outer_transaction_until_released() {
    let node = node_with(&[("x", 0)]);
    let x: TRef<i64> = TRef::new("x");
    let holder_has_lock = Arc::new(Barrier::new(2));
    let release = Arc::new(Barrier::new(2));
    let holder = {
        let (node, a, b) = (node.clone(), holder_has_lock.clone(), release.clone());
        thread::spawn(move || {
            let mut first = true;
            node.atomically(|tx| {
                tx.open_nested(|tx| tx.abstract_lock("L"))?;
                if first {
                    first = false;
                    a.wait();
                    b.wait();
                }
                Ok(())
            })
            .unwrap()
        })
    };
    holder_has_lock.wait();
    let attempts = AtomicUsize::new(0);
    let contender = {
        let node = node.clone();
        let x = x.clone();
        thread::spawn(move || {
            node.tx().max_attempts(1_000_000).run(|tx| {
                attempts.fetch_add(1, Ordering::Relaxed);
                tx.open_nested(|tx| tx.abstract_lock("L"))?;
                tx.modify(&x, |v| *v += 1)
            })?;
            Ok::<usize, TxError>(attempts.load(Ordering::Relaxed))
        })
    };
    thread::sleep(Duration::from_millis(30));
    release.wait();
    holder.join().unwrap();
    let tries = contender.join().unwrap().unwrap();
    assert!(
        tries >= 2,
        "the contender was aborted while the lock was held ({tries} attempts)"
    );
    assert!(node.stats().aborts.abstract_lock >= 1);
    assert_eq!(node.atomically_read(|tx| Ok(*tx.read(&x)?)).unwrap(), 1);
}

#[test]
fn checkpoints_resume_from_the_latest_valid_step() {
    let node = node_with(&[("a", 1), ("b", 2), ("c", 3)]);
    let (a, b, c): (TRef<i64>, TRef<i64>, TRef<i64>) =
        (TRef::new("a"), TRef::new("b"), TRef::new("c"));
    let runs = [
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    ];
    let other = node.clone();
    let sum = node
        .steps(0i64)
        .step(|tx, s| {
            runs[0].fetch_add(1, Ordering::Relaxed);
            *s += *tx.read(&a)?;
            Ok(())
        })
        .step(|tx, s| {
            runs[1].fetch_add(1, Ordering::Relaxed);
            *s += *tx.read(&b)?;
            Ok(())
        })
        .step(|tx, s| {
            let n = runs[2].fetch_add(1, Ordering::Relaxed);
            if n == 0 {
                // b changes under us: step 2's read is stale, step 1's is not.
                thread::scope(|sc| {
                    sc.spawn(|| other.atomically(|tx| tx.write(&b, 20)).unwrap());
                });
            }
            *s += *tx.read(&c)?;
            tx.write(&c, *s)
        })
        .run()
        .unwrap();
    assert_eq!(sum, 1 + 20 + 3);
    assert_eq!(
        runs[0].load(Ordering::Relaxed),
        1,
        "the first step did not re-run"
    );
    assert_eq!(runs[1].load(Ordering::Relaxed), 2);
    assert_eq!(runs[2].load(Ordering::Relaxed), 2);
    assert_eq!(node.atomically_read(|tx| Ok(*tx.read(&c)?)).unwrap(), 24);
    assert!(node.stats().checkpoint_resumes >= 1);
}

#[test]
fn trefs_work_as_values_and_across_nodes() {
    #[derive(Clone, serde::Serialize, serde::Deserialize, atomos::Object)]
    #[atomos(name = "test.Link")]
    struct Link {
        next: Option<TRef<Link>>,
        value: u32,
    }
    let n1 = Node::local();
    let n2 = Node::local();
    let head: TRef<Link> = TRef::new("head");
    let tail: TRef<Link> = TRef::new("tail");
    for node in [&n1, &n2] {
        node.atomically(|tx| {
            tx.create(
                &tail,
                Link {
                    next: None,
                    value: 2,
                },
            )?;
            tx.create(
                &head,
                Link {
                    next: Some(tail.clone()),
                    value: 1,
                },
            )
        })
        .unwrap();
    }
    n2.atomically(|tx| tx.modify(&tail, |l| l.value = 5))
        .unwrap();
    for (node, want) in [(&n1, 3), (&n2, 6)] {
        let sum = node
            .atomically_read(|tx| {
                let mut sum = 0;
                let mut cur = Some(head.clone());
                while let Some(r) = cur {
                    let l = tx.read(&r)?;
                    sum += l.value;
                    cur = l.next.clone();
                }
                Ok(sum)
            })
            .unwrap();
        assert_eq!(sum, want);
    }
}

#[test]
fn a_panicking_transaction_changes_nothing_and_releases_its_locks() {
    let node = node_with(&[("x", 1)]);
    let x: TRef<i64> = TRef::new("x");
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        node.atomically(|tx| {
            tx.open_nested(|tx| tx.abstract_lock("P"))?;
            tx.write(&x, 99)?;
            panic!("application bug");
            #[allow(unreachable_code)]
            Ok(())
        })
    }));
    assert!(panicked.is_err());
    assert!(!node.engine().abstract_lock_held("P"));
    assert_eq!(node.atomically_read(|tx| Ok(*tx.read(&x)?)).unwrap(), 1);
    // The node is still usable from this thread.
    node.atomically(|tx| tx.modify(&x, |v| *v += 1)).unwrap();
    assert_eq!(node.atomically_read(|tx| Ok(*tx.read(&x)?)).unwrap(), 2);
}

#[test]
fn a_tref_outlives_the_node_it_was_used_on() {
    let r: TRef<u32> = TRef::new("k");
    {
        let first = Node::local();
        first.atomically(|tx| tx.create(&r, 1)).unwrap();
    }
    let second = Node::local();
    assert!(matches!(
        second.atomically(|tx| tx.read(&r).copied()),
        Err(TxError::NotFound { .. })
    ));
    second.atomically(|tx| tx.create(&r, 2)).unwrap();
    assert_eq!(
        second.atomically_read(|tx| tx.read(&r).copied()).unwrap(),
        2
    );
}

#[test]
fn failing_actions_are_counted() {
    let node = node_with(&[("x", 0)]);
    node.atomically(|tx| {
        tx.on_commit(|_| Err(TxError::abort("notification failed")));
        tx.write(&TRef::<i64>::new("x"), 1)
    })
    .unwrap();
    assert_eq!(node.stats().handler_failures, 1);
    assert_eq!(node.stats().commits, 2);
}
