//! The generated bank's audits, as node processes log them ("bank audit ... total=T run=R
//! transfers=N counted=..."): what the process tests check nothing acknowledged was lost with.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// One audit line: the total, this run, its acknowledged transfers, every run's count.
pub struct Audit {
    pub total: i64,
    pub run: u64,
    pub transfers: u64,
    pub counted: BTreeMap<u64, u64>,
}

fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let rest = line.split(&format!(" {name}=")).nth(1)?;
    let rest = rest.strip_prefix('"').unwrap_or(rest);
    rest.split(['"', ' ']).next()
}

pub fn audits(log: &Path) -> Vec<Audit> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert!(
        !text.contains("bank audit failed"),
        "{} has a failed audit",
        log.display()
    );
    text.lines()
        .filter(|l| l.contains("bank audit"))
        .map(|l| {
            let num = |name| {
                field(l, name)
                    .and_then(|v| v.parse::<i64>().ok())
                    .unwrap_or_else(|| panic!("no {name} in {l}"))
            };
            let counted = field(l, "counted")
                .unwrap_or("")
                .split(',')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (r, n) = p.split_once(':').expect("run:count");
                    (r.parse().unwrap(), n.parse().unwrap())
                })
                .collect();
            Audit {
                total: num("total"),
                run: num("run") as u64,
                transfers: num("transfers") as u64,
                counted,
            }
        })
        .collect()
}

/// Waits until `log` has `n` audits of a running load.
pub fn wait_audits(log: &Path, n: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while audits(log).iter().filter(|a| a.transfers > 0).count() < n {
        assert!(
            Instant::now() < deadline,
            "{what}: no running bank in time; it logged:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// After a run with kills and restarts: `all_logs` are every process's log, `current` the
/// running ones'. No replica reported a divergence; every audit anywhere found `total`; at
/// least `min_runs` runs audited and more than 50 transfers were acknowledged; every transfer
/// a killed run saw acknowledged is counted on every running replica, and a live run's own
/// last audit counts at least what it had acknowledged when it began.
pub fn nothing_acknowledged_lost(
    all_logs: &[std::path::PathBuf],
    current: &[std::path::PathBuf],
    total: i64,
    min_runs: usize,
) {
    // Replicas compared their digests (every 5 s) and never found each other apart.
    for log in all_logs {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        assert!(
            !text.contains("replicas diverged"),
            "{} reports a divergence",
            log.display()
        );
    }
    let mut acked: BTreeMap<u64, u64> = BTreeMap::new();
    for log in all_logs {
        for a in audits(log) {
            assert_eq!(a.total, total, "{} audited a wrong total", log.display());
            let e = acked.entry(a.run).or_default();
            *e = (*e).max(a.transfers);
        }
    }
    assert!(acked.len() >= min_runs, "runs: {acked:?}");
    let total_acked: u64 = acked.values().sum();
    assert!(
        total_acked > 50,
        "only {total_acked} transfers acknowledged"
    );
    let dead: Vec<u64> = all_logs
        .iter()
        .filter(|l| !current.contains(l))
        .flat_map(|l| audits(l).into_iter().map(|a| a.run))
        .collect();
    for log in current {
        let last = audits(log).pop().expect("an audit");
        let mut runs: Vec<u64> = dead.clone();
        runs.push(last.run);
        for run in runs {
            let counted = last.counted.get(&run).copied().unwrap_or(0);
            assert!(
                counted >= acked[&run],
                "{}: run {run} saw {} transfers acknowledged, the state counts {counted}",
                log.display(),
                acked[&run]
            );
        }
    }
}
