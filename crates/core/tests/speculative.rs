//! The speculative serial executor against a plain serial run of the final order: whatever the
//! optimistic deliveries and revocations before it, every finally delivered invocation comes to
//! what it comes to when the final order runs one invocation at a time, and the objects end
//! the same; read-only transactions never see a speculative write.

use std::sync::Arc;

use atomos_core::{
    encode_arguments, Engine, EngineConfig, Invocation, Outcome, ProcedureKind, Procedures,
    SerialExecutor, TRef, Tx, TxError, TxOptions,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ACCOUNTS: u64 = 6;

fn account(i: u64) -> TRef<i64> {
    TRef::new(format!("acct/{i}"))
}

fn procedures() -> Procedures {
    let p = Procedures::new();
    p.register(
        "transfer",
        ProcedureKind::Update,
        |tx: &mut Tx<'_>, &(from, to, amount): &(u64, u64, i64)| {
            let balance = *tx.read(&account(from))?;
            if balance < amount {
                return Err(TxError::abort(format!("{from} has only {balance}")));
            }
            tx.write(&account(from), balance - amount)?;
            tx.modify(&account(to), |b| *b += amount)?;
            Ok(balance - amount)
        },
    )
    .unwrap();
    // Reads every account and writes their sum into one of them: wide reads.
    p.register(
        "gather",
        ProcedureKind::Update,
        |tx: &mut Tx<'_>, &into: &u64| {
            let mut sum = 0;
            for i in 0..ACCOUNTS {
                if i != into && tx.exists(&account(i))? {
                    sum += *tx.read(&account(i))?;
                    tx.write(&account(i), 0)?;
                }
            }
            if tx.exists(&account(into))? {
                tx.modify(&account(into), |b| *b += sum)?;
            } else {
                tx.create(&account(into), sum)?;
            }
            Ok(sum)
        },
    )
    .unwrap();
    // Deletes an account or opens it again with a balance: absent objects.
    p.register(
        "toggle",
        ProcedureKind::Update,
        |tx: &mut Tx<'_>, &(i, balance): &(u64, i64)| {
            if tx.exists(&account(i))? {
                let old = *tx.read(&account(i))?;
                tx.delete(&account(i))?;
                Ok(old)
            } else {
                tx.create(&account(i), balance)?;
                Ok(0)
            }
        },
    )
    .unwrap();
    p
}

fn read_only() -> TxOptions {
    TxOptions {
        read_only: true,
        ..TxOptions::default()
    }
}

fn engine() -> Arc<Engine> {
    Arc::new(Engine::new(EngineConfig {
        replicated: true,
        ..EngineConfig::default()
    }))
}

fn open(engine: &Engine) {
    engine
        .atomically(|tx| {
            for i in 0..ACCOUNTS {
                tx.create(&account(i), 100)?;
            }
            Ok(())
        })
        .unwrap();
}

fn random_invocation(rng: &mut StdRng) -> Invocation {
    let (procedure, arguments) = match rng.random_range(0..10) {
        0 => (
            "gather",
            encode_arguments("gather", &rng.random_range(0..ACCOUNTS)).unwrap(),
        ),
        1 => (
            "toggle",
            encode_arguments("toggle", &(rng.random_range(0..ACCOUNTS), 50i64)).unwrap(),
        ),
        2 => ("missing", Vec::new()),
        3 => ("transfer", vec![0xff]), // arguments that do not decode
        _ => (
            "transfer",
            encode_arguments(
                "transfer",
                &(
                    rng.random_range(0..ACCOUNTS),
                    rng.random_range(0..ACCOUNTS),
                    rng.random_range(1..80i64),
                ),
            )
            .unwrap(),
        ),
    };
    Invocation {
        procedure: procedure.to_string(),
        arguments,
    }
}

/// What a serial run of `inv` on `engine` comes to.
fn run_serially(engine: &Engine, procedures: &Procedures, inv: &Invocation) -> Outcome {
    let result = procedures
        .get(&inv.procedure)
        .and_then(|p| engine.atomically(|tx| p.call(tx, &inv.arguments)));
    match result {
        Ok(bytes) => Outcome::Returned(bytes),
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

fn objects(engine: &Engine) -> Vec<(atomos_core::Key, Option<Vec<u8>>)> {
    engine
        .snapshot_objects()
        .unwrap()
        .into_iter()
        .map(|(k, _, v)| (k, v))
        .collect()
}

/// Drives an executor as the order layer would, at random: optimistic deliveries of entries
/// holding a few invocations, revocations of the entries not yet final (a new leader's
/// different entries follow), final deliveries in order. Checks every final outcome against a
/// serial run of the final order, and the objects at the end.
fn check_seed(seed: u64) -> (u64, u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let procedures = procedures();
    let (speculating, reference) = (engine(), engine());
    open(&speculating);
    open(&reference);
    let mut executor = SerialExecutor::new(speculating.clone(), procedures.clone());
    // Entries delivered optimistically and not final yet: (seq, invocations). An entry
    // without invocations stands for a transaction certified between the procedures (a
    // closure under `active`): it writes at its final delivery and is never speculated.
    let mut opt: Vec<(u64, Vec<Invocation>)> = Vec::new();
    let (mut final_next, mut opt_next, mut position) = (1u64, 1u64, 100u64);
    let mut finals = 0;
    for _ in 0..400 {
        match rng.random_range(0..10) {
            0..=4 => {
                let invs: Vec<Invocation> = match rng.random_range(0..6) {
                    0 => Vec::new(),
                    _ => (0..rng.random_range(1..4))
                        .map(|_| random_invocation(&mut rng))
                        .collect(),
                };
                // A replica that restarted has no speculation for what it had received.
                if rng.random_range(0..10) > 0 {
                    for (i, inv) in invs.iter().enumerate() {
                        executor.speculate((opt_next, i as u32), inv);
                    }
                }
                opt.push((opt_next, invs));
                opt_next += 1;
            }
            5 if opt_next > final_next => {
                let from = rng.random_range(final_next..opt_next);
                opt.retain(|(seq, _)| *seq < from);
                executor.revoke((from, 0));
                opt_next = from;
            }
            _ if opt_next > final_next && !opt.is_empty() => {
                let (seq, invs) = opt.remove(0);
                assert_eq!(seq, final_next);
                if invs.is_empty() {
                    let i = rng.random_range(0..ACCOUNTS);
                    let value = rng.random_range(0..500i64);
                    reference
                        .atomically(|tx| match tx.exists(&account(i))? {
                            true => tx.write(&account(i), value),
                            false => tx.create(&account(i), value),
                        })
                        .unwrap();
                    let (_, bytes) = reference.newest_encoded(account(i).key()).unwrap();
                    position += 1;
                    let key = account(i).key().clone();
                    assert!(speculating.apply_certified(position, &[], vec![(key, bytes)]));
                }
                for (i, inv) in invs.iter().enumerate() {
                    position += 1 + rng.random_range(0..3);
                    let got = executor.finalize((seq, i as u32), position, inv, |_, _| {});
                    let want = run_serially(&reference, &procedures, inv);
                    assert_eq!(
                        got, want,
                        "seed {seed}: entry {seq} invocation {i} ({})",
                        inv.procedure
                    );
                    finals += 1;
                }
                final_next += 1;
            }
            _ => {}
        }
        // No read-only transaction sees a speculative write: the committed objects are the
        // reference's at every moment.
        assert_eq!(objects(&speculating), objects(&reference), "seed {seed}");
    }
    let stats = executor.stats();
    assert_eq!(stats.confirmed + stats.rerun, finals);
    (stats.confirmed, stats.rerun)
}

#[test]
fn final_outcomes_and_objects_equal_a_serial_run_of_the_final_order() {
    let seeds: u64 = std::env::var("ATOMOS_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let (mut confirmed, mut rerun) = (0, 0);
    for seed in 0..seeds {
        let (c, r) = check_seed(seed);
        confirmed += c;
        rerun += r;
    }
    println!("over {seeds} seeds: {confirmed} speculative runs confirmed, {rerun} run again");
    assert!(confirmed > 0, "no speculation was ever confirmed");
    assert!(
        rerun > 0,
        "no speculation was ever run again: revocations never mattered"
    );
}

#[test]
fn in_order_finals_confirm_every_speculation_and_snapshots_see_none_early() {
    let procedures = procedures();
    let engine = engine();
    open(&engine);
    let mut executor = SerialExecutor::new(engine.clone(), procedures);
    let transfer = |from: u64, to: u64, amount: i64| Invocation {
        procedure: "transfer".into(),
        arguments: encode_arguments("transfer", &(from, to, amount)).unwrap(),
    };
    // A chain: each transfer reads what the one before wrote, speculatively.
    let chain: Vec<Invocation> = (0..ACCOUNTS - 1)
        .map(|i| transfer(i, i + 1, 100 + i as i64 * 100))
        .collect();
    for (n, inv) in chain.iter().enumerate() {
        executor.speculate((n as u64 + 1, 0), inv);
    }
    assert_eq!(executor.pending(), chain.len());
    let last = ACCOUNTS - 1;
    let seen = engine
        .run(&read_only(), |tx| {
            Ok::<i64, TxError>(*tx.read(&account(last))?)
        })
        .unwrap();
    assert_eq!(seen, 100, "a read-only transaction saw a speculative write");
    for (n, inv) in chain.iter().enumerate() {
        let out = executor.finalize((n as u64 + 1, 0), 10 + n as u64, inv, |_, _| {});
        assert_eq!(
            out,
            Outcome::Returned(postcard::to_allocvec(&0i64).unwrap())
        );
    }
    let stats = executor.stats();
    assert_eq!((stats.confirmed, stats.rerun), (chain.len() as u64, 0));
    let last_balance = engine
        .run(&read_only(), |tx| {
            Ok::<i64, TxError>(*tx.read(&account(last))?)
        })
        .unwrap();
    assert_eq!(last_balance, 100 + 100 * ACCOUNTS as i64 - 100);
    assert_eq!(engine.applied(), 10 + chain.len() as u64 - 1);
}

/// A procedure that panics, or uses what cannot happen identically on every replica (new
/// anonymous objects, abstract locks, open nesting, on-commit or on-abort actions), fails
/// alike on every replica, writes nothing, and the executor goes on.
#[test]
fn what_cannot_run_on_every_replica_fails_the_invocation_and_nothing_else() {
    let procedures = procedures();
    type Body = fn(&mut Tx<'_>, &u64) -> Result<(), TxError>;
    let bodies: [(&str, Body); 6] = [
        ("panics", |_, _| panic!("a bug in a procedure")),
        ("new_object", |tx, _| tx.new_object(1u64).map(|_| ())),
        ("abstract_lock", |tx, _| tx.abstract_lock("name")),
        ("open_nested", |tx, _| {
            tx.open_nested(|tx| tx.write(&account(0), 7))
        }),
        ("on_commit", |tx, _| {
            tx.write(&account(0), 7)?;
            tx.on_commit(|_| Ok(()));
            Ok(())
        }),
        ("on_abort", |tx, _| {
            tx.on_abort(|_| Ok(()));
            tx.write(&account(0), 7)
        }),
    ];
    for (name, body) in bodies {
        procedures
            .register(name, ProcedureKind::Update, body)
            .unwrap();
    }
    let engine = engine();
    open(&engine);
    let before = objects(&engine);
    let mut executor = SerialExecutor::new(engine.clone(), procedures);
    let mut position = 100;
    for (n, (name, _)) in bodies.iter().enumerate() {
        let inv = Invocation {
            procedure: name.to_string(),
            arguments: encode_arguments(name, &0u64).unwrap(),
        };
        for speculate in [true, false] {
            let slot = (2 * n as u64 + speculate as u64 + 1, 0);
            if speculate {
                executor.speculate(slot, &inv);
            }
            position += 1;
            match executor.finalize(slot, position, &inv, |_, _| {}) {
                Outcome::Failed(why) => assert!(
                    why.contains("cannot be used inside a procedure") || why.contains("panicked"),
                    "{name}: {why}"
                ),
                other => panic!("{name}: {other:?}"),
            }
            assert_eq!(objects(&engine), before, "{name} wrote something");
        }
    }
    // The executor goes on.
    let transfer = Invocation {
        procedure: "transfer".into(),
        arguments: encode_arguments("transfer", &(0u64, 1u64, 5i64)).unwrap(),
    };
    executor.speculate((100, 0), &transfer);
    assert!(matches!(
        executor.finalize((100, 0), 1_000, &transfer, |_, _| {}),
        Outcome::Returned(_)
    ));
}
