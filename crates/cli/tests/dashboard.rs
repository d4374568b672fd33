//! The Grafana dashboard in deploy/grafana queries only metrics the nodes publish: every
//! `atomos_...` name in its queries is one the code records (a counter of the order replica by
//! its name in `OrderStats`, any other by the literal the code passes to the recorder).

use std::collections::BTreeSet;
use std::path::Path;

use atomos::order::OrderStats;

const DASHBOARD: &str = "../../deploy/grafana/atomos-dashboard.json";

/// Every `atomos_...` metric name in `text`, without the histogram's series suffixes.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("atomos_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let base = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        names.insert(base.to_string());
        rest = &tail[end..];
    }
    names
}

/// The text of every Rust file under `dir`.
fn sources(dir: &Path, into: &mut String) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push_str(&std::fs::read_to_string(&path).unwrap());
        }
    }
}

#[test]
fn the_dashboard_queries_only_metrics_the_nodes_publish() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join(DASHBOARD)).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard parses");
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut exprs = String::new();
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        let targets = panel["targets"].as_array().expect("targets");
        assert!(
            !targets.is_empty(),
            "panel {} queries nothing",
            panel["title"]
        );
        for t in targets {
            exprs.push_str(t["expr"].as_str().expect("an expression"));
            exprs.push('\n');
        }
    }
    let mut code = String::new();
    sources(&root.join("../../crates"), &mut code);
    let replica_counters: BTreeSet<String> = OrderStats::default()
        .counters()
        .iter()
        .map(|(name, _)| format!("atomos_order_replica_{name}_total"))
        .collect();
    let names = metric_names(&exprs);
    assert!(names.len() > 15, "{names:?}");
    let unknown: Vec<&String> = names
        .iter()
        .filter(|n| !replica_counters.contains(*n) && !code.contains(&format!("\"{n}\"")))
        .collect();
    assert!(
        unknown.is_empty(),
        "the dashboard queries unknown metrics: {unknown:?}"
    );
}
