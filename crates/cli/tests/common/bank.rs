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
