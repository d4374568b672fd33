//! Tests of the harness: runs of every workload, the report, bad configurations.

use super::*;

/// A TPC-C population that loads in milliseconds.
const TINY: TpccScale = TpccScale {
    items: 200,
    customers: 30,
    orders: 30,
};

fn quick(kind: WorkloadKind, objects: usize, read_ratio: f64) -> BenchReport {
    run(&BenchConfig {
        workload: kind,
        protocol: Protocol::Local,
        nodes: 1,
        threads: 3,
        objects,
        read_ratio,
        duration: Duration::from_millis(300),
        seed: 7,
        scale: TINY,
        ..BenchConfig::default()
    })
    .unwrap()
}

#[test]
fn every_workload_keeps_its_invariant_under_contention() {
    for kind in WorkloadKind::ALL {
        // Small structures, mostly updates: many conflicts.
        let r = quick(kind, 32, 0.2);
        assert!(r.invariant_ok, "{}: {}", kind, r.invariant);
        assert!(r.committed > 0, "{kind} committed nothing");
        assert!(r.latency_us.samples > 0);
    }
}

#[test]
fn every_workload_runs_on_tfa_across_nodes() {
    every_workload_runs_across_nodes(Protocol::Tfa, false);
}

/// The workers as fibers on the nodes' runtime: every workload's transactions suspend where
/// they wait for TFA's answers, interleaved on the runtime's two threads.
#[test]
fn every_workload_runs_on_tfa_as_fibers() {
    every_workload_runs_across_nodes(Protocol::Tfa, true);
}

/// Each workload's check runs on every replica (see `check_replicas`).
#[test]
fn every_workload_runs_on_certify_across_replicas() {
    every_workload_runs_across_nodes(Protocol::Certify, false);
}

/// Certify's fibers suspend while their commits are ordered and applied.
#[test]
fn every_workload_runs_on_certify_as_fibers() {
    every_workload_runs_across_nodes(Protocol::Certify, true);
}

/// Under `active` the workloads' closures are certified between procedures.
#[test]
fn every_workload_runs_on_active_across_replicas() {
    every_workload_runs_across_nodes(Protocol::Active, false);
}

/// `active`'s fibers suspend while their procedures and certified closures are ordered and
/// applied.
#[test]
fn every_workload_runs_on_active_as_fibers() {
    every_workload_runs_across_nodes(Protocol::Active, true);
}

/// `oss`'s fibers suspend while the ultra-peer sequences their commits.
#[test]
fn every_workload_runs_on_oss_as_fibers() {
    every_workload_runs_across_nodes(Protocol::Oss, true);
}

/// Under `oss` every workload's commits go through the ultra-peer; the counters through
/// each commit mode.
#[test]
fn every_workload_runs_on_oss_across_nodes() {
    every_workload_runs_across_nodes(Protocol::Oss, false);
    for oss_commit in [CommitMode::DistributedToken, CommitMode::CoordinatorToken] {
        for workload in [WorkloadKind::SharedCounter, WorkloadKind::PrivateCounters] {
            let r = run(&BenchConfig {
                workload,
                protocol: Protocol::Oss,
                nodes: 3,
                threads: 2,
                duration: Duration::from_millis(300),
                work: Duration::from_millis(1),
                pause: Duration::from_millis(1),
                oss_commit,
                ..BenchConfig::default()
            })
            .unwrap();
            let what = format!("{workload} with {oss_commit:?}");
            assert!(r.invariant_ok, "{what}: {}", r.invariant);
            assert!(r.committed > 0, "{what} committed nothing");
            assert_eq!(r.oss_commit.as_deref(), Some(oss_commit.name()));
        }
    }
}

/// The counters as linked transactions keep their sum, and the shared counter is the hot
/// spot its conflicts name.
#[test]
fn linked_counters_keep_their_sum_and_name_their_hot_spot() {
    for workload in [WorkloadKind::PrivateCounters, WorkloadKind::SharedCounter] {
        let r = run(&BenchConfig {
            workload,
            protocol: Protocol::Oss,
            nodes: 3,
            threads: 2,
            duration: Duration::from_millis(400),
            work: Duration::from_millis(1),
            linked: 1,
            ..BenchConfig::default()
        })
        .unwrap();
        assert!(r.invariant_ok, "{workload}: {}", r.invariant);
        assert!(r.committed > 0, "{workload} committed nothing");
        if workload == WorkloadKind::SharedCounter && r.aborted > 0 {
            assert!(
                r.hot_spots.iter().any(|h| h.key.contains("counter")),
                "{:?}",
                r.hot_spots
            );
        }
    }
}

/// Linked chains in fibers: a fiber waiting for its chain's oldest commit, or for a handle,
/// suspends. Over TCP on one runtime thread a wait that blocked the thread would stop the
/// network the commit needs, and the run would never end.
#[test]
fn linked_counters_run_as_fibers_on_one_runtime_thread() {
    for protocol in [Protocol::Oss, Protocol::Certify] {
        for workload in [WorkloadKind::PrivateCounters, WorkloadKind::SharedCounter] {
            let cfg = BenchConfig {
                workload,
                protocol,
                nodes: 3,
                transport: TransportKind::Tcp,
                threads: 4,
                fibers: true,
                runtime_threads: 1,
                duration: Duration::from_millis(400),
                work: Duration::ZERO,
                pause: Duration::ZERO,
                linked: 2,
                ..BenchConfig::default()
            };
            let what = format!("{workload} on {protocol}");
            // A run that stops making progress fails here instead of hanging the tests.
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                // The receiver is gone only if it gave up waiting.
                let _ = tx.send(run(&cfg));
            });
            let r = match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(r) => r.unwrap(),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    panic!("{what}: no result in 60 s")
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("{what}: the run panicked")
                }
            };
            assert!(r.invariant_ok, "{what}: {}", r.invariant);
            assert!(r.committed > 0, "{what} committed nothing");
            assert!(r.fibers, "{what}");
        }
    }
}

fn every_workload_runs_across_nodes(protocol: Protocol, fibers: bool) {
    for transport in [TransportKind::Memory, TransportKind::Tcp] {
        for kind in WorkloadKind::ALL {
            let r = run(&BenchConfig {
                workload: kind,
                protocol,
                nodes: 3,
                transport,
                // More fibers than the runtime has threads, so that they interleave; over TCP
                // all of them and every socket share one runtime thread.
                threads: if fibers { 4 } else { 2 },
                fibers,
                runtime_threads: if fibers && transport == TransportKind::Tcp {
                    1
                } else {
                    2
                },
                objects: 32,
                read_ratio: 0.3,
                balance_k: Some(4),
                duration: Duration::from_millis(300),
                seed: 3,
                scale: TINY,
                ..BenchConfig::default()
            })
            .unwrap();
            let what = format!("{kind} on {protocol} over {transport}, fibers {fibers}");
            assert!(r.invariant_ok, "{what}: {}", r.invariant);
            assert_eq!(r.fibers, fibers);
            let runtime_threads = if fibers && transport == TransportKind::Tcp {
                1
            } else {
                2
            };
            assert_eq!(r.runtime_threads, Some(runtime_threads), "{what}");
            assert!(r.committed > 0, "{what} committed nothing");
            assert_eq!(r.nodes, 3);
            // TFA's counters cover the measured run.
            match (&r.tfa, protocol) {
                (Some(t), Protocol::Tfa) => assert!(t.commits > 0, "{what}: {t:?}"),
                (None, Protocol::Tfa) => panic!("{what}: no TFA counters"),
                (Some(_), _) => panic!("{what}: TFA counters without TFA"),
                (None, _) => {}
            }
        }
    }
}

#[test]
fn every_nesting_model_keeps_its_invariant_under_contention() {
    for protocol in [Protocol::Local, Protocol::Tfa, Protocol::Certify] {
        for kind in [WorkloadKind::Bank, WorkloadKind::HashTable] {
            for nesting in NestingModel::ALL {
                let r = run(&BenchConfig {
                    workload: kind,
                    protocol,
                    nodes: if protocol == Protocol::Local { 1 } else { 2 },
                    threads: 3,
                    objects: 16,
                    read_ratio: 0.1,
                    balance_k: Some(4),
                    nesting,
                    inner: 4,
                    duration: Duration::from_millis(300),
                    seed: 5,
                    scale: TINY,
                    ..BenchConfig::default()
                })
                .unwrap();
                let what = format!("{kind} {nesting} on {protocol}");
                assert!(r.invariant_ok, "{what}: {}", r.invariant);
                assert!(r.committed > 0, "{what} committed nothing");
            }
        }
    }
}

#[test]
fn tpcc_runs_open_loop_under_every_policy_with_its_checks_passing() {
    use atomos::service::Policy;
    for (protocol, sched) in [
        (Protocol::Local, Policy::None),
        (Protocol::Local, Policy::Preemptive),
        (Protocol::Local, Policy::Cmax(2)),
        (Protocol::Local, Policy::Lazy(2)),
        (Protocol::Certify, Policy::Preemptive),
        (Protocol::Tfa, Policy::Preemptive),
        (Protocol::Oss, Policy::Preemptive),
    ] {
        let r = run(&BenchConfig {
            workload: WorkloadKind::Tpcc,
            protocol,
            nodes: if protocol == Protocol::Local { 1 } else { 2 },
            scale: TINY,
            duration: Duration::from_millis(400),
            arrival_rate: Some(2_000.0),
            sched,
            contexts: 16,
            ..BenchConfig::default()
        })
        .unwrap();
        let what = format!("{sched} on {protocol}");
        assert!(r.invariant_ok, "{what}: {}", r.invariant);
        let open = r.sched.as_ref().expect("an open-loop report");
        assert_eq!(open.sched, sched.name());
        assert!(open.requests > 200, "{what}: {} requests", open.requests);
        assert_eq!(r.committed, open.requests, "{what}: every request ended");
        // Every priority of table 6.1 arrived and has a turnaround, of which its
        // execution (start to end) is a part.
        for level in ["1", "2", "3", "4", "5"] {
            let t = &open.turnaround_us[level];
            assert!(
                t.count > 0 && t.mean > 0.0 && t.p99 >= t.p50,
                "{what}: {level}: {t:?}"
            );
            let e = &open.execution_us[level];
            assert!(
                e.count == t.count && e.mean > 0.0 && e.mean <= t.mean,
                "{what}: {level}: execution {e:?}, turnaround {t:?}"
            );
            let running = &open.running_us[level];
            assert!(
                running.count == t.count && running.mean > 0.0 && running.mean <= e.mean,
                "{what}: {level}: running {running:?}, execution {e:?}"
            );
        }
    }
    let refused = |cfg: BenchConfig| run(&cfg).expect_err("refused");
    assert!(matches!(
        refused(BenchConfig {
            workload: WorkloadKind::Bank,
            arrival_rate: Some(100.0),
            duration: Duration::from_millis(50),
            ..BenchConfig::default()
        }),
        BenchError::Config(_)
    ));
    assert!(matches!(
        refused(BenchConfig {
            workload: WorkloadKind::Tpcc,
            arrival_rate: Some(-1.0),
            ..BenchConfig::default()
        }),
        BenchError::Config(_)
    ));
}

#[test]
fn macro_workloads_run_for_seconds_at_their_defaults_with_checks_passing() {
    for kind in [
        WorkloadKind::Vacation,
        WorkloadKind::Loan,
        WorkloadKind::Tpcc,
    ] {
        let r = run(&BenchConfig {
            workload: kind,
            objects: kind.default_objects(),
            duration: Duration::from_secs(2),
            ..BenchConfig::default()
        })
        .unwrap();
        assert!(r.invariant_ok, "{kind}: {}", r.invariant);
        assert!(r.duration_s >= 2.0);
        // Every kind of operation ran and was timed.
        for p in &r.profiles {
            assert!(p.committed > 0, "{kind}: no {} ran", p.name);
        }
        assert_eq!(
            r.profiles.iter().map(|p| p.committed).sum::<u64>(),
            r.committed
        );
    }
}

#[test]
fn read_only_operations_never_abort() {
    let r = quick(WorkloadKind::Bank, 64, 1.0);
    assert_eq!(r.aborted, 0);
    assert_eq!(r.stats.read_only_commits, r.committed);
}

#[test]
fn bad_configuration_is_refused() {
    let mut cfg = BenchConfig {
        workload: WorkloadKind::Bank,
        protocol: Protocol::Local,
        nodes: 1,
        threads: 1,
        objects: 10,
        read_ratio: 1.5,
        duration: Duration::from_millis(10),
        seed: 1,
        scale: TINY,
        ..BenchConfig::default()
    };
    assert!(matches!(run(&cfg), Err(BenchError::Config(_))));
    cfg.read_ratio = 0.5;
    cfg.nodes = 3;
    assert!(matches!(run(&cfg), Err(BenchError::Config(_))));
    // Fibers: only on a runtime (not on a local node), only closed loops that do not sleep.
    cfg.fibers = true;
    cfg.protocol = Protocol::Local;
    cfg.nodes = 1;
    assert!(matches!(run(&cfg), Err(BenchError::Config(_))));
    cfg.protocol = Protocol::Tfa;
    cfg.pause = Duration::from_millis(1);
    assert!(matches!(run(&cfg), Err(BenchError::Config(_))));
    cfg.pause = Duration::ZERO;
    // Nor open loops.
    cfg.arrival_rate = Some(1000.0);
    match run(&cfg) {
        Err(BenchError::Config(m)) => assert!(m.contains("--fibers"), "{m}"),
        other => panic!("fibers in an open loop: {:?}", other.map(|r| r.committed)),
    }
    cfg.arrival_rate = None;
    cfg.fibers = false;
    // A runtime needs a worker, and a bounded number of them.
    for runtime_threads in [0, crate::MAX_RUNTIME_THREADS + 1] {
        cfg.runtime_threads = runtime_threads;
        match run(&cfg) {
            Err(BenchError::Config(m)) => assert!(m.contains("--runtime-threads"), "{m}"),
            other => panic!(
                "{runtime_threads} runtime threads: {:?}",
                other.map(|r| r.committed)
            ),
        }
    }
}
