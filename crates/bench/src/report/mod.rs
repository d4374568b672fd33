//! `atomos report`: reads benchmark results (the JSON `atomos bench --json` writes) and draws
//! them as the seed papers do: throughput and abort rate against the setting that varies
//! (threads, nodes, read ratio, ...), one line per protocol or other setting, and latency per
//! kind of operation; for open-loop runs, turnaround per priority and scheduling policy. Runs
//! repeated with the same settings are drawn as their median.

mod plot;
mod sched;
mod series;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::harness::{Latency, ProfileReport};

pub use series::{Axis, Figure};

/// One benchmark result, as read back from its JSON (fields of older results may be missing).
#[derive(Clone, Debug, Deserialize)]
pub struct Point {
    /// Workload name.
    pub workload: String,
    /// Protocol name.
    pub protocol: String,
    /// Nodes.
    pub nodes: usize,
    /// Transport between the nodes.
    #[serde(default)]
    pub transport: String,
    /// Threads per node.
    pub threads: usize,
    /// Objects.
    pub objects: usize,
    /// Read-only fraction.
    pub read_ratio: f64,
    /// Bank balance width.
    #[serde(default)]
    pub balance_k: Option<usize>,
    /// Nesting model.
    #[serde(default)]
    pub nesting: String,
    /// Inner operations per update.
    #[serde(default)]
    pub inner: usize,
    /// Vacation queries.
    #[serde(default)]
    pub queries: Option<usize>,
    /// TPC-C warehouses.
    #[serde(default)]
    pub warehouses: Option<usize>,
    /// TPC-C mix.
    #[serde(default)]
    pub mix: Option<String>,
    /// TPC-C scale.
    #[serde(default)]
    pub scale: Option<String>,
    /// Contention manager.
    #[serde(default)]
    pub contention: String,
    /// `oss`: how commits were numbered.
    #[serde(default)]
    pub oss_commit: Option<String>,
    /// Delay of every link between nodes.
    #[serde(default)]
    pub link_delay_ms: f64,
    /// `tfa`: how long a waiting application thread polled for an answer.
    #[serde(default)]
    pub answer_poll_us: Option<f64>,
    /// TCP: how long each transport busy-polled after activity.
    #[serde(default)]
    pub busy_poll_us: Option<f64>,
    /// Each node ran in a process of its own.
    #[serde(default)]
    pub processes: bool,
    /// The workers ran as fibers on the nodes' network runtime.
    #[serde(default)]
    pub fibers: bool,
    /// Worker threads of the nodes' network runtime in each process.
    #[serde(default)]
    pub runtime_threads: Option<usize>,
    /// Linked transactions: commits outstanding per worker (0: none).
    #[serde(default)]
    pub linked: usize,
    /// Committed transactions per second.
    pub throughput_tps: f64,
    /// Aborted attempts per attempt.
    pub abort_rate: f64,
    /// Latency of a whole operation.
    pub latency_us: Latency,
    /// Per kind of operation.
    #[serde(default)]
    pub profiles: Vec<ProfileReport>,
    /// Whether the invariant held.
    pub invariant_ok: bool,
    /// Open-loop runs: the transaction service's policy.
    #[serde(default)]
    pub sched: Option<String>,
    /// Open-loop runs: C_max, under `cmax` and `lazy`.
    #[serde(default)]
    pub cmax: Option<u32>,
    /// Open-loop runs: turnaround per priority.
    #[serde(default)]
    pub turnaround_us: Option<BTreeMap<String, Turnaround>>,
}

/// A priority's turnaround in an open-loop result, in microseconds.
#[derive(Clone, Debug, Deserialize)]
pub struct Turnaround {
    /// Mean.
    pub mean: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// Why a report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A result file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A result file is not a benchmark result.
    #[error("{path} is not an atomos bench result: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
    /// Nothing to draw.
    #[error("no result files given")]
    Empty,
    /// The output directory or a figure could not be written.
    #[error("cannot write {path}: {reason}")]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// Reads result files.
pub fn load(files: &[PathBuf]) -> Result<Vec<Point>, ReportError> {
    if files.is_empty() {
        return Err(ReportError::Empty);
    }
    files
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path).map_err(|source| ReportError::Read {
                path: path.clone(),
                source,
            })?;
            serde_json::from_str(&text).map_err(|source| ReportError::Parse {
                path: path.clone(),
                source,
            })
        })
        .collect()
}

/// Draws every figure the points make into `out` (created if missing), each as SVG and PNG;
/// answers the files written.
pub fn render(points: &[Point], out: &Path) -> Result<Vec<PathBuf>, ReportError> {
    std::fs::create_dir_all(out).map_err(|e| ReportError::Write {
        path: out.to_path_buf(),
        reason: e.to_string(),
    })?;
    let mut written = Vec::new();
    for figure in series::figures(points)
        .into_iter()
        .chain(sched::figures(points))
    {
        written.extend(plot::draw(&figure, out)?);
    }
    Ok(written)
}

#[cfg(test)]
mod tests;
