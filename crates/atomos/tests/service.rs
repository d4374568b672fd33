//! Transactions under a node's transaction service (PRESTO): preempted at safe points, resumed
//! on another worker, consistent across preemption, and serializable.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atomos::history::check_serializable;
use atomos::service::{Policy, ServiceConfig, ServiceError};
use atomos::{Key, Node, NodeConfig, TRef, TxError, TxService};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn service(node: &Node, workers: usize, policy: Policy) -> TxService {
    TxService::start(
        node,
        ServiceConfig {
            workers,
            levels: 5,
            contexts: 64,
            stack_bytes: 256 * 1024,
            policy,
            ..ServiceConfig::default()
        },
    )
    .expect("a valid configuration")
}

#[derive(Clone, Default)]
struct Flag(Arc<AtomicBool>);

impl Flag {
    fn set(&self) {
        self.0.store(true, Ordering::Release);
    }
    fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
    fn wait(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.is_set() {
            assert!(Instant::now() < deadline, "a flag was never set");
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

fn counter(node: &Node, name: &str, value: i64) -> TRef<i64> {
    let r = TRef::new(Key::from(name));
    node.atomically(|tx| tx.create(&r, value)).expect("created");
    r
}

/// A long transaction: reads `objects` over and over, with a safe point after each read,
/// until `stop` is set; then increments `target`.
fn long_increment(
    s: &TxService,
    level: u8,
    objects: Vec<TRef<i64>>,
    target: TRef<i64>,
    running: &Flag,
    stop: &Flag,
) -> atomos::service::Ticket<Result<i64, TxError>> {
    let (running, stop) = (running.clone(), stop.clone());
    s.submit(level, move |tx| {
        running.set();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut sum = 0;
        while !stop.is_set() && Instant::now() < deadline {
            for o in &objects {
                sum += *tx.read(o)?;
            }
        }
        tx.modify(&target, |v| *v += 1)?;
        Ok(sum)
    })
    .expect("submitted")
}

#[test]
fn a_preempted_transaction_resumes_on_another_worker_and_commits() {
    let node = Node::local();
    let objects: Vec<_> = (0..20)
        .map(|i| counter(&node, &format!("o{i}"), 1))
        .collect();
    let (a_count, b_count) = (counter(&node, "a", 0), counter(&node, "b", 0));
    let s = service(&node, 2, Policy::Preemptive);
    let (a_runs, b_runs, stop_low) = (Flag::default(), Flag::default(), Flag::default());
    let a = long_increment(&s, 1, objects.clone(), a_count.clone(), &a_runs, &stop_low);
    let b = long_increment(&s, 1, objects, b_count.clone(), &b_runs, &stop_low);
    a_runs.wait();
    b_runs.wait();
    // The urgent transaction keeps the worker it took until released; the other low one ends
    // and its worker resumes the preempted one.
    let (urgent_runs, release) = (Flag::default(), Flag::default());
    let urgent = long_increment(
        &s,
        5,
        vec![],
        counter(&node, "u", 0),
        &urgent_runs,
        &release,
    );
    urgent_runs.wait();
    stop_low.set();
    let (a_sum, a_timing) = a.wait().expect("ran");
    let (b_sum, b_timing) = b.wait().expect("ran");
    release.set();
    urgent.wait().expect("ran").0.expect("committed");
    assert!(a_sum.expect("committed") > 0 && b_sum.expect("committed") > 0);
    assert_eq!(a_timing.preemptions + b_timing.preemptions, 1);
    assert_eq!(a_timing.migrations + b_timing.migrations, 1);
    let counts = node
        .atomically(|tx| Ok((*tx.read(&a_count)?, *tx.read(&b_count)?)))
        .expect("read");
    assert_eq!(counts, (1, 1), "both committed once");
}

#[test]
fn a_preempted_transaction_never_sees_what_committed_while_it_waited_mixed_with_what_it_read() {
    // x and y are always equal. The low transaction reads x, is preempted by one that
    // increments both, then reads y: it must not go on with x != y (it re-runs instead).
    let node = Node::local();
    let (x, y) = (counter(&node, "x", 0), counter(&node, "y", 0));
    let s = service(&node, 1, Policy::Preemptive);
    let (low_read_x, urgent_done, torn) = (Flag::default(), Flag::default(), Flag::default());
    let attempts = Arc::new(AtomicU64::new(0));
    let low = {
        let (x, y, low_read_x, urgent_done, torn, attempts) = (
            x.clone(),
            y.clone(),
            low_read_x.clone(),
            urgent_done.clone(),
            torn.clone(),
            attempts.clone(),
        );
        s.submit(1, move |tx| {
            attempts.fetch_add(1, Ordering::Relaxed);
            let seen_x = *tx.read(&x)?;
            low_read_x.set();
            let deadline = Instant::now() + Duration::from_secs(10);
            while !urgent_done.is_set() && Instant::now() < deadline {
                tx.yield_now()?;
            }
            let seen_y = *tx.read(&y)?;
            if seen_x != seen_y {
                torn.set();
            }
            tx.write(&x, seen_x + 10)?;
            tx.write(&y, seen_y + 10)?;
            Ok(())
        })
        .expect("submitted")
    };
    low_read_x.wait();
    let urgent = {
        let (x, y, urgent_done) = (x.clone(), y.clone(), urgent_done.clone());
        s.submit(5, move |tx| {
            tx.modify(&x, |v| *v += 1)?;
            tx.modify(&y, |v| *v += 1)?;
            Ok(())
        })
        .map(|t| (t, urgent_done))
        .expect("submitted")
    };
    let (ticket, urgent_done) = urgent;
    let (result, urgent_timing) = ticket.wait().expect("ran");
    result.expect("committed");
    urgent_done.set();
    let (result, low_timing) = low.wait().expect("ran");
    result.expect("committed");
    assert!(!torn.is_set(), "a preempted transaction saw x and y differ");
    assert!(low_timing.preemptions >= 1);
    assert!(urgent_timing.ended < low_timing.ended);
    assert_eq!(
        attempts.load(Ordering::Relaxed),
        2,
        "its stale attempt re-ran"
    );
    let (vx, vy) = node
        .atomically(|tx| Ok((*tx.read(&x)?, *tx.read(&y)?)))
        .expect("read");
    assert_eq!((vx, vy), (11, 11));
}

/// Transfers at every level with safe points between reads and writes, and audits at the top
/// level, under each policy: every audit sees the total, the total holds at the end, and the
/// recorded history is serializable.
fn bank_under(policy: Policy) -> atomos::service::ServiceStats {
    const ACCOUNTS: u64 = 16;
    const INITIAL: i64 = 1_000;
    let node = Node::new(NodeConfig {
        record_history: true,
        ..NodeConfig::default()
    });
    let accounts: Vec<TRef<i64>> = (0..ACCOUNTS)
        .map(|i| TRef::new(Key::with_index("acct/", i)))
        .collect();
    node.atomically(|tx| {
        for a in &accounts {
            tx.create(a, INITIAL)?;
        }
        Ok(())
    })
    .expect("created");
    let s = service(&node, 2, policy);
    let accounts = Arc::new(accounts);
    // Two long level-1 audits hold both workers until every transfer is queued: transfers
    // above level 1 have to preempt them.
    let release = Flag::default();
    let blockers: Vec<_> = (0..2)
        .map(|_| {
            let (accounts, release, running) = (accounts.clone(), release.clone(), Flag::default());
            let ticket = s
                .submit(1, {
                    let running = running.clone();
                    move |tx| {
                        running.set();
                        let deadline = Instant::now() + Duration::from_secs(10);
                        loop {
                            let mut total = 0;
                            for a in accounts.iter() {
                                total += *tx.read(a)?;
                            }
                            if release.is_set() || Instant::now() > deadline {
                                return Ok(total);
                            }
                        }
                    }
                })
                .expect("submitted");
            running.wait();
            ticket
        })
        .collect();
    let mut rng = SmallRng::seed_from_u64(17);
    let mut transfers = Vec::new();
    let mut audits = Vec::new();
    for _ in 0..600 {
        let (from, to) = (rng.random_range(0..ACCOUNTS), rng.random_range(0..ACCOUNTS));
        let amount = rng.random_range(1..50i64);
        let level = rng.random_range(1..=4u8);
        let mine = accounts.clone();
        transfers.push(
            s.submit(level, move |tx| {
                let (from, to) = (&mine[from as usize], &mine[to as usize]);
                let balance = *tx.read(from)?;
                // A long transaction: many reads, each a safe point.
                for _ in 0..20 {
                    for a in mine.iter() {
                        tx.read(a)?;
                    }
                }
                tx.write(from, balance - amount)?;
                tx.modify(to, |v| *v += amount)?;
                Ok(())
            })
            .expect("submitted"),
        );
    }
    // Released before anything of the top level arrives (promoted blockers could hold the
    // workers against it).
    release.set();
    for b in blockers {
        audits.push(b.wait().expect("ran").0);
    }
    // Audits arrive one at a time while the workers are busy with transfers.
    for _ in 0..30 {
        let accounts = accounts.clone();
        let audit = s
            .submit(5, move |tx| {
                let mut total = 0;
                for a in accounts.iter() {
                    total += *tx.read(a)?;
                }
                Ok(total)
            })
            .expect("submitted");
        audits.push(audit.wait().expect("ran").0);
    }
    for t in transfers {
        t.wait().expect("ran").0.expect("committed");
    }
    for total in audits {
        assert_eq!(total.expect("committed"), ACCOUNTS as i64 * INITIAL);
    }
    let stats = s.stats();
    drop(s);
    let total = node
        .atomically(|tx| {
            let mut total = 0;
            for a in accounts.iter() {
                total += *tx.read(a)?;
            }
            Ok(total)
        })
        .expect("read");
    assert_eq!(total, ACCOUNTS as i64 * INITIAL);
    let history = node.engine().history().expect("recorded").take();
    assert_eq!(check_serializable(&history), Ok(()));
    stats
}

#[test]
fn the_bank_invariant_and_serializability_hold_under_preemption() {
    let stats = bank_under(Policy::Preemptive);
    assert!(
        stats.preemptions > 0,
        "transfers preempted the blockers ({stats:?})"
    );
}

#[test]
fn the_bank_invariant_and_serializability_hold_under_cmax_and_lazy() {
    bank_under(Policy::Cmax(2));
    bank_under(Policy::Lazy(2));
}

#[test]
fn procedures_run_at_a_priority_and_bad_requests_are_refused() {
    let node = Node::local();
    let c = counter(&node, "c", 0);
    node.register("bump", move |tx, by: &i64| {
        tx.modify(&c, |v| {
            *v += by;
            *v
        })
    })
    .expect("registered");
    let s = service(&node, 1, Policy::Preemptive);
    let args = atomos::encode_arguments("bump", &5i64).expect("encoded");
    let (result, _) = s
        .submit_procedure(3, "bump", args)
        .expect("submitted")
        .wait()
        .expect("ran");
    let value: i64 = atomos::decode_result("bump", &result.expect("committed")).expect("decoded");
    assert_eq!(value, 5);
    let c = TRef::<i64>::new("c");
    assert_eq!(node.atomically_read(|tx| Ok(*tx.read(&c)?)).unwrap(), 5);
    let (missing, _) = s
        .submit_procedure(3, "nope", vec![])
        .expect("submitted")
        .wait()
        .expect("ran");
    assert!(matches!(missing, Err(TxError::NoSuchProcedure { .. })));
    assert!(matches!(
        s.submit(9, |_| Ok(())),
        Err(ServiceError::Queue(_))
    ));
}
