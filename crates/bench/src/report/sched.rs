//! The figures of open-loop runs, beside PRESTO's 6.1 and 6.2: mean turnaround per priority,
//! one line per scheduling policy, and each policy's speed-up over the baseline (`none`) per
//! priority. Repeated runs of one policy are drawn as their median.

use std::collections::BTreeMap;

use super::series::{Figure, Line};
use super::Point;

/// The line a run belongs to: its policy, with C_max where it has one.
fn policy_of(p: &Point) -> Option<String> {
    let sched = p.sched.as_ref()?;
    Some(match p.cmax {
        Some(n) => format!("{sched} (C_max {n})"),
        None => sched.clone(),
    })
}

/// Median over runs of each priority's mean turnaround, per policy in the order met.
fn mean_turnarounds(points: &[&Point]) -> Vec<(String, BTreeMap<u8, f64>)> {
    let mut order: Vec<String> = Vec::new();
    let mut samples: BTreeMap<String, BTreeMap<u8, Vec<f64>>> = BTreeMap::new();
    for p in points {
        let (Some(policy), Some(turnaround)) = (policy_of(p), p.turnaround_us.as_ref()) else {
            continue;
        };
        if !order.contains(&policy) {
            order.push(policy.clone());
        }
        for (level, t) in turnaround {
            if let Ok(level) = level.parse::<u8>() {
                samples
                    .entry(policy.clone())
                    .or_default()
                    .entry(level)
                    .or_default()
                    .push(t.mean);
            }
        }
    }
    order
        .into_iter()
        .map(|policy| {
            let medians = samples
                .remove(&policy)
                .unwrap_or_default()
                .into_iter()
                .map(|(level, mut v)| {
                    v.sort_by(f64::total_cmp);
                    (level, v[v.len() / 2])
                })
                .collect();
            (policy, medians)
        })
        .collect()
}

/// For each workload with open-loop runs: mean turnaround per priority, and (when a `none`
/// run is among them) the speed-up of every other policy over it.
pub(super) fn figures(points: &[Point]) -> Vec<Figure> {
    let mut workloads: Vec<&str> = Vec::new();
    for p in points.iter().filter(|p| p.turnaround_us.is_some()) {
        if !workloads.contains(&p.workload.as_str()) {
            workloads.push(&p.workload);
        }
    }
    let mut out = Vec::new();
    for workload in workloads {
        let runs: Vec<&Point> = points.iter().filter(|p| p.workload == workload).collect();
        let policies = mean_turnarounds(&runs);
        let xs: Vec<f64> = {
            let mut levels: Vec<u8> = policies
                .iter()
                .flat_map(|(_, m)| m.keys().copied())
                .collect();
            levels.sort_unstable();
            levels.dedup();
            levels.into_iter().map(f64::from).collect()
        };
        out.push(Figure::Lines {
            name: format!("{workload}-turnaround"),
            title: format!("{workload}: mean turnaround per priority (PRESTO fig. 6.1)"),
            x_label: "priority (1 lowest)".into(),
            y_label: "mean turnaround (us, log scale)".into(),
            xs: xs.clone(),
            lines: policies
                .iter()
                .map(|(policy, m)| Line {
                    label: policy.clone(),
                    points: m.iter().map(|(l, t)| (f64::from(*l), *t)).collect(),
                })
                .collect(),
            log_y: true,
        });
        let Some((_, baseline)) = policies.iter().find(|(p, _)| p == "none") else {
            continue;
        };
        let speedups: Vec<Line> = policies
            .iter()
            .filter(|(p, _)| p != "none")
            .map(|(policy, m)| Line {
                label: policy.clone(),
                points: m
                    .iter()
                    .filter_map(|(l, t)| {
                        let base = baseline.get(l)?;
                        (*t > 0.0).then(|| (f64::from(*l), base / t))
                    })
                    .collect(),
            })
            .collect();
        if !speedups.is_empty() {
            out.push(Figure::Lines {
                name: format!("{workload}-speedup"),
                title: format!(
                    "{workload}: baseline over policy mean turnaround (PRESTO fig. 6.2)"
                ),
                x_label: "priority (1 lowest)".into(),
                y_label: "speed-up over none".into(),
                xs,
                lines: speedups,
                log_y: false,
            });
        }
    }
    out
}
