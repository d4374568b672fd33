//! The Grafana dashboard in deploy/grafana parses, every panel queries something, and every
//! `atomos_...` metric it queries is one the code records: a counter of the order replica by
//! its name in `OrderStats`, any other by a literal in the crates' sources (not their tests).
//! (The membership process test checks that running nodes publish them, with their labels.)

use std::path::Path;

use atomos::order::OrderStats;

mod common;

/// The text of every Rust file under `dir`, tests left out.
fn sources(dir: &Path, into: &mut String) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path
                .file_name()
                .is_some_and(|n| n != "tests" && n != "benches")
            {
                sources(&path, into);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push_str(&std::fs::read_to_string(&path).unwrap());
        }
    }
}

#[test]
fn the_dashboard_queries_only_metrics_the_code_records() {
    let mut code = String::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crates"),
        &mut code,
    );
    let names = common::dashboard::metrics();
    assert!(names.len() > 15, "{names:?}");
    let replica_counter = |name: &str| {
        let inner = name
            .strip_prefix("atomos_order_replica_")
            .and_then(|n| n.strip_suffix("_total"));
        inner.is_some_and(|n| {
            OrderStats::default()
                .counters()
                .iter()
                .any(|(c, _)| *c == n)
        })
    };
    let unknown: Vec<&String> = names
        .keys()
        .filter(|n| !replica_counter(n) && !code.contains(&format!("\"{n}\"")))
        .collect();
    assert!(
        unknown.is_empty(),
        "the dashboard queries unknown metrics: {unknown:?}"
    );
}
