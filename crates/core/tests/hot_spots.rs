//! Conflict monitoring: an object another transaction changed under a running one is counted
//! as that one's conflict, by name, most conflicted first.

use std::sync::Arc;

use atomos_core::{Engine, EngineConfig, Key, TRef};

#[test]
fn the_object_changed_under_a_transaction_is_counted() {
    let engine = Arc::new(Engine::new(EngineConfig {
        monitor_conflicts: true,
        ..EngineConfig::default()
    }));
    let hot: TRef<u64> = TRef::new("hot");
    let calm: TRef<u64> = TRef::new("calm");
    let out: TRef<u64> = TRef::new("out");
    engine
        .atomically(|tx| {
            tx.create(&hot, 0)?;
            tx.create(&calm, 0)?;
            tx.create(&out, 0)
        })
        .unwrap();
    for round in 0..3u64 {
        let mut first = true;
        engine
            .atomically(|tx| {
                let h = *tx.read(&hot)?;
                let c = *tx.read(&calm)?;
                if first {
                    first = false;
                    // Another thread commits a change of `hot` now: this attempt conflicts.
                    let (e, r) = (engine.clone(), hot.clone());
                    std::thread::spawn(move || e.atomically(|tx| tx.write(&r, round + 100)))
                        .join()
                        .unwrap()
                        .unwrap();
                }
                tx.write(&out, h + c)
            })
            .unwrap();
    }
    let top = engine.hot_spots(5);
    assert_eq!(top.first().map(|(k, _)| k.clone()), Some(Key::from("hot")));
    assert!(top[0].1 >= 3, "{top:?}");
    assert!(
        top.iter().all(|(k, _)| *k != Key::from("calm")),
        "an object nobody changed is no hot spot: {top:?}"
    );
}

/// Forward validation: `check` fails as soon as an object the attempt read was replaced, and
/// passes while nothing it read changed.
#[test]
fn a_check_fails_once_something_read_was_replaced() {
    let engine = Arc::new(Engine::new(EngineConfig::default()));
    let a: TRef<u64> = TRef::new("a");
    let b: TRef<u64> = TRef::new("b");
    engine
        .atomically(|tx| {
            tx.create(&a, 0)?;
            tx.create(&b, 0)
        })
        .unwrap();
    let mut attempts = 0;
    let mut checks_passed = 0;
    engine
        .atomically(|tx| {
            attempts += 1;
            let v = *tx.read(&a)?;
            // Something this attempt did not read changes: it goes on.
            let (e, r) = (engine.clone(), b.clone());
            std::thread::spawn(move || e.atomically(|tx| tx.modify(&r, |x| *x += 1)))
                .join()
                .unwrap()
                .unwrap();
            tx.check()?;
            checks_passed += 1;
            if attempts == 1 {
                // What it read changes: the check fails, and the attempt re-runs.
                let (e, r) = (engine.clone(), a.clone());
                std::thread::spawn(move || e.atomically(|tx| tx.write(&r, 7)))
                    .join()
                    .unwrap()
                    .unwrap();
                tx.check()?;
                unreachable!("the check passed after a read was replaced");
            }
            tx.write(&b, v)
        })
        .unwrap();
    assert_eq!((attempts, checks_passed), (2, 2));
    assert_eq!(engine.atomically(|tx| Ok(*tx.read(&b)?)).unwrap(), 7);
}
