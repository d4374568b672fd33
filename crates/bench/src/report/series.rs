//! Groups results into figures: per workload, the numeric setting that varies becomes the x
//! axis, and every other setting that varies tells the lines apart.

use std::collections::BTreeMap;

use super::Point;

/// A numeric setting results can be drawn against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Axis {
    /// Threads per node.
    Threads,
    /// Nodes.
    Nodes,
    /// Read-only fraction.
    ReadRatio,
    /// Objects.
    Objects,
    /// Inner operations per update.
    Inner,
    /// Vacation queries.
    Queries,
    /// TPC-C warehouses.
    Warehouses,
    /// Bank balance width.
    BalanceK,
}

impl Axis {
    /// Every axis, in the order one is preferred as the x axis.
    pub const ALL: [Axis; 8] = [
        Axis::Threads,
        Axis::Nodes,
        Axis::ReadRatio,
        Axis::Objects,
        Axis::Inner,
        Axis::Queries,
        Axis::Warehouses,
        Axis::BalanceK,
    ];

    /// The setting's value in a result (`None`: the workload has no such setting).
    pub fn value(self, p: &Point) -> Option<f64> {
        match self {
            Axis::Threads => Some(p.threads as f64),
            Axis::Nodes => Some(p.nodes as f64),
            Axis::ReadRatio => Some(p.read_ratio),
            Axis::Objects => Some(p.objects as f64),
            Axis::Inner => Some(p.inner as f64),
            Axis::Queries => p.queries.map(|q| q as f64),
            Axis::Warehouses => p.warehouses.map(|w| w as f64),
            Axis::BalanceK => p.balance_k.map(|k| k as f64),
        }
    }

    /// How the axis is labelled.
    pub fn label(self) -> &'static str {
        match self {
            Axis::Threads => "threads per node",
            Axis::Nodes => "nodes",
            Axis::ReadRatio => "read ratio",
            Axis::Objects => "objects",
            Axis::Inner => "inner operations per update",
            Axis::Queries => "queries per reservation",
            Axis::Warehouses => "warehouses",
            Axis::BalanceK => "accounts per balance",
        }
    }
}

/// Reads a setting that is not a number.
type Setting = fn(&Point) -> String;

/// Settings that are not drawn as an axis: protocol, transport, nesting, mix, scale,
/// contention, OSS commit mode, link delay, linked transactions, scheduling policy, answer
/// polling, busy polling, a process per node, fibers, runtime threads other than the default.
const CATEGORIES: [Setting; 15] = [
    |p| p.protocol.clone(),
    |p| p.transport.clone(),
    |p| p.nesting.clone(),
    |p| p.mix.clone().unwrap_or_default(),
    |p| p.scale.clone().unwrap_or_default(),
    |p| p.contention.clone(),
    |p| p.oss_commit.clone().unwrap_or_default(),
    |p| format!("link {} ms", p.link_delay_ms),
    |p| format!("linked {}", p.linked),
    |p| p.sched.clone().unwrap_or_default(),
    |p| {
        p.answer_poll_us
            .map(|us| format!("answer poll {us} us"))
            .unwrap_or_default()
    },
    |p| {
        p.busy_poll_us
            .map(|us| format!("busy poll {us} us"))
            .unwrap_or_default()
    },
    |p| {
        if p.processes {
            "a process per node".to_string()
        } else {
            String::new()
        }
    },
    |p| {
        if p.fibers {
            "fibers".to_string()
        } else {
            String::new()
        }
    },
    |p| match p.runtime_threads {
        Some(n) if n != crate::DEFAULT_RUNTIME_THREADS => format!("{n} runtime threads"),
        _ => String::new(),
    },
];

/// One line of a figure: (x, y) points in increasing x.
#[derive(Clone, Debug)]
pub struct Line {
    /// What the line stands for.
    pub label: String,
    /// The points.
    pub points: Vec<(f64, f64)>,
}

/// One bar group per kind of operation, one bar per line of the other figures.
#[derive(Clone, Debug)]
pub struct BarSeries {
    /// What the bars stand for.
    pub label: String,
    /// Median and 99th percentile latency per kind, in microseconds, in the figure's order.
    pub values: Vec<(f64, f64)>,
}

/// A figure to draw.
#[derive(Clone, Debug)]
pub enum Figure {
    /// Lines of y against x.
    Lines {
        /// File name without extension.
        name: String,
        /// Title.
        title: String,
        /// x axis label.
        x_label: String,
        /// y axis label.
        y_label: String,
        /// Every x value some line has (the axis's tick marks).
        xs: Vec<f64>,
        /// The lines.
        lines: Vec<Line>,
        /// Draw y on a logarithmic scale (for values spanning orders of magnitude).
        log_y: bool,
    },
    /// Latency per kind of operation.
    Bars {
        /// File name without extension.
        name: String,
        /// Title.
        title: String,
        /// The kinds of operation.
        groups: Vec<String>,
        /// The bars.
        series: Vec<BarSeries>,
    },
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The figures a set of results makes: for every workload, throughput and abort rate against
/// the first numeric setting that varies (threads if none does), and latency per kind of
/// operation when the workload reports kinds.
pub fn figures(points: &[Point]) -> Vec<Figure> {
    let mut workloads: Vec<&str> = Vec::new();
    for p in points {
        if !workloads.contains(&p.workload.as_str()) {
            workloads.push(&p.workload);
        }
    }
    let mut out = Vec::new();
    for workload in workloads {
        let runs: Vec<&Point> = points.iter().filter(|p| p.workload == workload).collect();
        out.extend(workload_figures(workload, &runs));
    }
    out
}

fn varies<T: PartialEq>(runs: &[&Point], f: impl Fn(&Point) -> T) -> bool {
    let first = f(runs[0]);
    runs.iter().any(|p| f(p) != first)
}

fn workload_figures(workload: &str, runs: &[&Point]) -> Vec<Figure> {
    let varying: Vec<Axis> = Axis::ALL
        .into_iter()
        .filter(|a| varies(runs, |p| a.value(p).map(f64::to_bits)))
        .collect();
    let x_axis = varying.first().copied().unwrap_or(Axis::Threads);
    let categories: Vec<Setting> = CATEGORIES.into_iter().filter(|f| varies(runs, f)).collect();
    let label_of = |p: &Point| -> String {
        let mut parts: Vec<String> = categories.iter().map(|f| f(p)).collect();
        for a in varying.iter().skip(1) {
            if let Some(v) = a.value(p) {
                parts.push(format!("{} {v}", a.label()));
            }
        }
        if parts.is_empty() {
            p.protocol.clone()
        } else {
            parts.join(", ")
        }
    };
    // Lines in the order their first result came, points by x; repeated runs as their median.
    let mut labels: Vec<String> = Vec::new();
    let mut grouped: BTreeMap<usize, BTreeMap<u64, Vec<&Point>>> = BTreeMap::new();
    for p in runs {
        let label = label_of(p);
        let i = match labels.iter().position(|l| *l == label) {
            Some(i) => i,
            None => {
                labels.push(label);
                labels.len() - 1
            }
        };
        let x = x_axis.value(p).unwrap_or(0.0);
        grouped
            .entry(i)
            .or_default()
            .entry(ordered_bits(x))
            .or_default()
            .push(p);
    }
    let line = |i: usize, y: &dyn Fn(&Point) -> f64| Line {
        label: labels[i].clone(),
        points: grouped[&i]
            .iter()
            .map(|(x, ps)| {
                (
                    from_ordered_bits(*x),
                    median(ps.iter().map(|p| y(p)).collect()),
                )
            })
            .collect(),
    };
    let mut xs: Vec<f64> = runs
        .iter()
        .map(|p| x_axis.value(p).unwrap_or(0.0))
        .collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    let lines_of = |y: &dyn Fn(&Point) -> f64| (0..labels.len()).map(|i| line(i, y)).collect();
    let mut figures = vec![
        Figure::Lines {
            name: format!("{workload}-throughput"),
            title: format!("{workload}: throughput"),
            x_label: x_axis.label().to_string(),
            y_label: "committed transactions per second".to_string(),
            xs: xs.clone(),
            lines: lines_of(&|p| p.throughput_tps),
            log_y: false,
        },
        Figure::Lines {
            name: format!("{workload}-aborts"),
            title: format!("{workload}: abort rate"),
            x_label: x_axis.label().to_string(),
            y_label: "aborted attempts per attempt".to_string(),
            xs: xs.clone(),
            lines: lines_of(&|p| p.abort_rate),
            log_y: false,
        },
    ];
    let groups: Vec<String> = runs
        .iter()
        .find(|p| !p.profiles.is_empty())
        .map(|p| p.profiles.iter().map(|k| k.name.clone()).collect())
        .unwrap_or_default();
    if !groups.is_empty() {
        // Each line's run at its largest x (the median-throughput one of repeated runs).
        let series = (0..labels.len())
            .filter_map(|i| {
                let (_, at_max) = grouped[&i].iter().next_back()?;
                let mut by_tps = at_max.clone();
                by_tps.sort_by(|a, b| a.throughput_tps.total_cmp(&b.throughput_tps));
                let run = by_tps[by_tps.len() / 2];
                let values = groups
                    .iter()
                    .map(|g| {
                        run.profiles
                            .iter()
                            .find(|k| &k.name == g)
                            .map_or((0.0, 0.0), |k| (k.latency_us.p50, k.latency_us.p99))
                    })
                    .collect();
                Some(BarSeries {
                    label: labels[i].clone(),
                    values,
                })
            })
            .collect();
        let at = xs.last().copied().unwrap_or(0.0);
        figures.push(Figure::Bars {
            name: format!("{workload}-latency"),
            title: format!(
                "{workload}: latency per operation, p50 (bar) and p99 (mark), {} {at}",
                x_axis.label()
            ),
            groups,
            series,
        });
    }
    figures
}

/// f64 bits that sort like the numbers (for non-negative values, which settings are).
fn ordered_bits(x: f64) -> u64 {
    x.max(0.0).to_bits()
}

fn from_ordered_bits(b: u64) -> f64 {
    f64::from_bits(b)
}
