//! The metrics the Grafana dashboard in deploy/grafana queries.

use std::collections::BTreeMap;
use std::path::Path;

/// The dashboard's file.
pub fn path() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/grafana/atomos-dashboard.json")
}

/// Every query of the dashboard's panels (rows have none; every other panel has one at least).
pub fn queries() -> Vec<String> {
    let text = std::fs::read_to_string(path()).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard parses");
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"].as_array().expect("targets");
        assert!(
            !targets.is_empty(),
            "panel {} queries nothing",
            panel["title"]
        );
        for t in targets {
            exprs.push(t["expr"].as_str().expect("an expression").to_string());
        }
    }
    exprs
}

/// Every `atomos_...` metric the queries name (without a histogram's series suffixes), and
/// whether some query selects it by its `node` label.
pub fn metrics() -> BTreeMap<String, bool> {
    let mut names = BTreeMap::new();
    for expr in queries() {
        let mut rest = expr.as_str();
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
            let by_node = tail[end..].starts_with("{node=");
            *names.entry(base.to_string()).or_insert(false) |= by_node;
            rest = &tail[end..];
        }
    }
    names
}
