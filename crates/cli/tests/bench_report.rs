//! The benchmark command as users run it: TPC-C with per-profile figures and its consistency
//! checks, a sweep writing one result per point, and the report drawing them; clusters with a
//! process per node.

use std::path::PathBuf;
use std::process::Command;

/// The binary under test.
const ATOMOS: &str = env!("CARGO_BIN_EXE_atomos");

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("atomos-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn atomos(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(ATOMOS).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn tpcc_prints_every_profile_and_passes_its_consistency_checks() {
    let dir = scratch("tpcc");
    let json = dir.join("tpcc.json");
    let (ok, out, err) = atomos(&[
        "bench",
        "tpcc",
        "--protocol",
        "local",
        "--threads",
        "2",
        "--duration",
        "3",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{out}\n{err}");
    for profile in [
        "new-order",
        "payment",
        "order-status",
        "delivery",
        "stock-level",
    ] {
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(profile))
            .unwrap_or_else(|| panic!("no {profile} line in:\n{out}"));
        assert!(line.contains("tx/s") && line.contains("p99"), "{line}");
    }
    assert!(
        out.contains("invariant OK") && out.contains("consistency conditions 1-10 and 12 hold"),
        "{out}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["profiles"].as_array().unwrap().len(), 5);
    assert_eq!(report["warehouses"], 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_sweep_writes_one_result_per_point_and_the_report_draws_them() {
    let dir = scratch("sweep");
    let json = dir.join("vacation.json");
    let (ok, out, err) = atomos(&[
        "bench",
        "vacation",
        "--sweep",
        "threads=1,2",
        "--duration",
        "0.5",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{out}\n{err}");
    let points: Vec<PathBuf> = ["1", "2"]
        .iter()
        .map(|t| dir.join(format!("vacation-threads-{t}.json")))
        .collect();
    for p in &points {
        assert!(p.exists(), "{} missing; output:\n{out}", p.display());
    }
    let figures = dir.join("figures");
    let mut args = vec!["report", "--out", figures.to_str().unwrap()];
    args.extend(points.iter().map(|p| p.to_str().unwrap()));
    let (ok, out, err) = atomos(&args);
    assert!(ok, "{out}\n{err}");
    for name in ["throughput", "aborts", "latency"] {
        for ext in ["svg", "png"] {
            let f = figures.join(format!("vacation-{name}.{ext}"));
            assert!(f.exists(), "{} missing; output:\n{out}", f.display());
        }
    }
    // A sweep without somewhere to write, and a report of a file that is not a result.
    let (ok, _, err) = atomos(&["bench", "bank", "--sweep", "threads=1,2"]);
    assert!(!ok && err.contains("--json"), "{err}");
    let (ok, _, err) = atomos(&["bench", "tpcc", "--objects", "5"]);
    assert!(!ok && err.contains("--warehouses and --scale"), "{err}");
    let (ok, _, err) = atomos(&["bench", "tpcc", "--mix", "odd"]);
    assert!(!ok && err.contains("--mix"), "{err}");
    // A bad value anywhere in a sweep is refused before the first point runs.
    let swept = dir.join("swept.json");
    let (ok, out, err) = atomos(&[
        "bench",
        "tpcc",
        "--duration",
        "0.2",
        "--json",
        swept.to_str().unwrap(),
        "--sweep",
        "mix=standard,odd",
    ]);
    assert!(!ok && err.contains("unknown TPC-C mix"), "{err}");
    assert!(!out.contains("[1/2]"), "a point ran: {out}");
    let junk = dir.join("junk.json");
    std::fs::write(&junk, "{}").unwrap();
    let (ok, _, err) = atomos(&["report", junk.to_str().unwrap()]);
    assert!(!ok && err.contains("not an atomos bench result"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_sweep_varies_the_runtime_threads_of_the_nodes() {
    let dir = scratch("runtime-threads");
    let json = dir.join("bank.json");
    let (ok, out, err) = atomos(&[
        "bench",
        "bank",
        "--protocol",
        "tfa",
        "--nodes",
        "2",
        "--balance-k",
        "2",
        "--fibers",
        "--sweep",
        "runtime-threads=1,2",
        "--duration",
        "0.3",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{out}\n{err}");
    for threads in [1, 2] {
        let point = dir.join(format!("bank-runtime-threads-{threads}.json"));
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&point).unwrap()).unwrap();
        assert_eq!(report["runtime_threads"], threads, "{}", point.display());
        assert_eq!(report["invariant_ok"], true, "{}", point.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_executor_benchmark_runs_transfers_as_procedures_and_conserves_money() {
    let dir = scratch("executor");
    let json = dir.join("executor.json");
    let (ok, out, err) = atomos(&[
        "bench",
        "executor",
        "--objects",
        "500",
        "--threads",
        "1",
        "--duration",
        "1",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("money conserved"), "{out}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(
        report["procedures_per_s"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    assert!(
        report["read_only_per_s"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    assert_eq!(report["confirmed_ratio"], 1.0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `bench bank` on `protocol` with a process per node and returns its JSON report.
fn bank_in_processes(protocol: &str, nodes: &str) -> serde_json::Value {
    let dir = scratch(&format!("processes-{protocol}"));
    let json = dir.join("bank.json");
    let (ok, out, err) = atomos(&[
        "bench",
        "bank",
        "--protocol",
        protocol,
        "--nodes",
        nodes,
        "--threads",
        "2",
        "--transport",
        "tcp",
        "--processes",
        "--objects",
        "200",
        "--balance-k",
        "2",
        "--duration",
        "2",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "{out}\n{err}");
    assert!(
        out.contains("a process per node") && out.contains("invariant OK"),
        "{out}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    report
}

#[test]
fn tfa_runs_with_a_process_per_node_and_keeps_the_money() {
    let report = bank_in_processes("tfa", "3");
    assert_eq!(report["processes"], true);
    assert_eq!(report["nodes"], 3);
    assert_eq!(report["invariant_ok"], true);
    // Both kinds ran, on every member's workers together.
    for profile in report["profiles"].as_array().unwrap() {
        assert!(profile["committed"].as_u64().unwrap() > 0, "{profile}");
    }
    assert!(report["latency_us"]["samples"].as_u64().unwrap() > 0);
    assert!(report["stats"]["commits"].as_u64().unwrap() > 0);
}

#[test]
fn a_replicated_protocol_runs_with_a_process_per_node_and_every_replica_is_checked() {
    let report = bank_in_processes("certify", "3");
    assert_eq!(report["processes"], true);
    assert_eq!(report["invariant_ok"], true);
    assert!(report["committed"].as_u64().unwrap() > 0);
}
