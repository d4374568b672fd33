//! Engines committing through an ordered log: a log in this process certifies every request on
//! every replica in one order, as the order layer does between machines.

use std::sync::{Arc, Weak};
use std::time::Duration;

use atomos_core::{
    Certification, Certifier, CertifyError, Engine, EngineConfig, Key, LockOutcome, TRef, TxError,
    TxOptions, Verdict,
};
use parking_lot::Mutex;

/// Replicas and the log they share: each certification is applied on every replica, in order,
/// under one lock.
struct Log {
    replicas: Mutex<Vec<Weak<Engine>>>,
    position: Mutex<u64>,
    /// While set, certifications fail as undecided.
    cut_off: Mutex<bool>,
    /// The replicated abstract-lock table.
    locks: Mutex<std::collections::HashMap<String, u64>>,
}

impl Certifier for Log {
    fn certify(&self, c: Certification) -> Result<Verdict, CertifyError> {
        if *self.cut_off.lock() {
            return Err(CertifyError::unknown("cut off"));
        }
        let mut position = self.position.lock();
        *position += 1;
        let mut verdicts = Vec::new();
        for r in self.replicas.lock().iter().filter_map(Weak::upgrade) {
            verdicts.push(r.apply_certified(*position, &c.reads, c.writes.clone()));
        }
        assert!(
            verdicts.windows(2).all(|w| w[0] == w[1]),
            "replicas decided differently"
        );
        Ok(if verdicts[0] {
            Verdict::Committed { version: *position }
        } else {
            Verdict::Conflict
        })
    }

    fn barrier(&self) -> Result<u64, CertifyError> {
        if *self.cut_off.lock() {
            return Err(CertifyError::unknown("cut off"));
        }
        let mut position = self.position.lock();
        *position += 1;
        for r in self.replicas.lock().iter().filter_map(Weak::upgrade) {
            r.mark_applied(*position);
        }
        Ok(*position)
    }

    fn abstract_lock(&self, owner: u64, name: &str) -> Result<LockOutcome, CertifyError> {
        let mut locks = self.locks.lock();
        Ok(match locks.get(name) {
            Some(&o) if o == owner => LockOutcome::AlreadyHeld,
            Some(_) => LockOutcome::HeldByAnother,
            None => {
                locks.insert(name.to_string(), owner);
                LockOutcome::Taken
            }
        })
    }

    fn release_abstract(&self, owner: u64, names: Vec<String>) {
        let mut locks = self.locks.lock();
        for n in names {
            if locks.get(&n) == Some(&owner) {
                locks.remove(&n);
            }
        }
    }
}

fn cluster(n: usize) -> (Arc<Log>, Vec<Arc<Engine>>) {
    let log = Arc::new(Log {
        replicas: Mutex::new(Vec::new()),
        position: Mutex::new(0),
        cut_off: Mutex::new(false),
        locks: Mutex::new(Default::default()),
    });
    let engines: Vec<Arc<Engine>> = (0..n)
        .map(|_| {
            Arc::new(Engine::new(EngineConfig {
                replicated: true,
                ..EngineConfig::default()
            }))
        })
        .collect();
    for e in &engines {
        assert!(e.set_certifier(log.clone()));
        log.replicas.lock().push(Arc::downgrade(e));
    }
    (log, engines)
}

fn account(i: u64) -> TRef<i64> {
    TRef::new(Key::with_index("acct/", i))
}

#[test]
fn transfers_on_three_replicas_keep_every_replica_identical() {
    let (_log, engines) = cluster(3);
    const ACCOUNTS: u64 = 16;
    engines[0]
        .atomically(|tx| {
            for i in 0..ACCOUNTS {
                tx.create(&account(i), 100)?;
            }
            Ok(())
        })
        .unwrap();
    std::thread::scope(|s| {
        for (t, e) in engines.iter().enumerate().cycle().take(6) {
            let e = e.clone();
            s.spawn(move || {
                let mut x = t as u64 * 7 + 1;
                for _ in 0..300 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let (a, b) = ((x >> 33) % ACCOUNTS, (x >> 13) % ACCOUNTS);
                    if a == b {
                        continue;
                    }
                    e.atomically(|tx| {
                        tx.modify(&account(a), |v| *v -= 3)?;
                        tx.modify(&account(b), |v| *v += 3)?;
                        Ok(())
                    })
                    .unwrap();
                    // Read-only audits see a consistent snapshot and never abort.
                    let total = e
                        .run(
                            &TxOptions {
                                read_only: true,
                                ..TxOptions::default()
                            },
                            |tx| {
                                let mut sum = 0;
                                for i in 0..ACCOUNTS {
                                    sum += *tx.read(&account(i))?;
                                }
                                Ok::<_, TxError>(sum)
                            },
                        )
                        .unwrap();
                    assert_eq!(total, 100 * ACCOUNTS as i64);
                }
            });
        }
    });
    let first = engines[0].snapshot_objects().unwrap();
    for e in &engines[1..] {
        assert_eq!(e.snapshot_objects().unwrap(), first);
        assert_eq!(e.applied(), engines[0].applied());
    }
    let total: i64 = engines[2]
        .atomically(|tx| (0..ACCOUNTS).map(|i| tx.read(&account(i)).copied()).sum())
        .unwrap();
    assert_eq!(total, 100 * ACCOUNTS as i64);
    let stats = engines
        .iter()
        .map(|e| e.stats())
        .fold(0, |n, s| n + s.read_only_commits);
    assert!(stats > 0);
}

#[test]
fn concurrent_creations_of_one_root_have_one_winner() {
    let (_log, engines) = cluster(2);
    let root: TRef<String> = TRef::new("root");
    // Both read the root as missing before either commits.
    let barrier = std::sync::Barrier::new(2);
    let results: Vec<Result<(), TxError>> = std::thread::scope(|s| {
        let handles: Vec<_> = engines
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let (root, barrier) = (root.clone(), &barrier);
                s.spawn(move || {
                    let mut first = true;
                    e.atomically(|tx| {
                        tx.create(&root, format!("made by {i}"))?;
                        if first {
                            first = false;
                            barrier.wait();
                        }
                        Ok(())
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let wins = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(wins, 1, "{results:?}");
    assert!(results
        .iter()
        .any(|r| matches!(r, Err(TxError::AlreadyExists { .. }))));
    let a = engines[0].atomically(|tx| tx.read(&root).cloned()).unwrap();
    let b = engines[1].atomically(|tx| tx.read(&root).cloned()).unwrap();
    assert_eq!(a, b);
}

#[test]
fn retry_wakes_when_the_log_changes_what_it_read() {
    let (_log, engines) = cluster(2);
    let flag: TRef<bool> = TRef::new("flag");
    engines[0].atomically(|tx| tx.create(&flag, false)).unwrap();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            engines[1].atomically(|tx| {
                if !*tx.read(&flag)? {
                    return tx.retry();
                }
                Ok(())
            })
        });
        std::thread::sleep(Duration::from_millis(50));
        engines[0].atomically(|tx| tx.write(&flag, true)).unwrap();
        waiter.join().unwrap().unwrap();
    });
}

#[test]
fn a_commit_without_a_verdict_is_reported_and_not_rerun() {
    let (log, engines) = cluster(1);
    let r: TRef<u64> = TRef::new("x");
    engines[0].atomically(|tx| tx.create(&r, 1)).unwrap();
    *log.cut_off.lock() = true;
    let mut runs = 0;
    let out = engines[0].atomically(|tx| {
        runs += 1;
        tx.write(&r, 2)
    });
    assert!(
        matches!(out, Err(TxError::OutcomeUnknown { .. })),
        "{out:?}"
    );
    assert_eq!(runs, 1);
    // Reads still work, and see the last decided state.
    *log.cut_off.lock() = false;
    assert_eq!(engines[0].atomically(|tx| tx.read(&r).copied()).unwrap(), 1);
}

#[test]
fn a_snapshot_installed_elsewhere_gives_the_same_objects_and_certifies_the_same() {
    let (_log, engines) = cluster(1);
    let kept: TRef<Vec<u8>> = TRef::new("kept");
    let gone: TRef<u32> = TRef::new("gone");
    engines[0]
        .atomically(|tx| {
            tx.create(&kept, vec![1, 2])?;
            tx.create(&gone, 7)
        })
        .unwrap();
    engines[0].atomically(|tx| tx.delete(&gone)).unwrap();
    let objects = engines[0].snapshot_objects().unwrap();
    // The deletion is kept, with its version.
    assert_eq!(objects.len(), 2);
    assert!(objects
        .iter()
        .any(|(k, v, b)| k == gone.key() && *v == 2 && b.is_none()));

    let fresh = Engine::new(EngineConfig {
        replicated: true,
        ..EngineConfig::default()
    });
    // An object the snapshot does not have becomes never written.
    let stray: TRef<u8> = TRef::new("stray");
    fresh.atomically(|tx| tx.create(&stray, 1)).unwrap();
    fresh.install_snapshot(engines[0].applied(), objects.clone());
    assert_eq!(fresh.snapshot_objects().unwrap(), objects);
    assert_eq!(fresh.applied(), 2);
    assert_eq!(fresh.version_of(stray.key()), 0);
    assert!(!fresh.atomically(|tx| tx.exists(&stray)).unwrap());
    assert_eq!(
        fresh.atomically(|tx| tx.read(&kept).cloned()).unwrap(),
        vec![1, 2]
    );
    assert!(matches!(
        fresh.atomically(|tx| tx.read(&gone).copied()),
        Err(TxError::NotFound { .. })
    ));
    // A value read as another type than it was written is refused.
    let wrong: TRef<String> = TRef::new("kept");
    assert!(matches!(
        fresh.atomically(|tx| tx.read(&wrong).cloned()),
        Err(TxError::WrongType { .. })
    ));
    // The same certification decides the same on both.
    let reads = vec![(kept.key().clone(), 1), (gone.key().clone(), 2)];
    assert!(engines[0].apply_certified(3, &reads, vec![]));
    assert!(fresh.apply_certified(3, &reads, vec![]));
    let stale = vec![(kept.key().clone(), 0)];
    assert!(!engines[0].apply_certified(4, &stale, vec![]));
    assert!(!fresh.apply_certified(4, &stale, vec![]));
}
