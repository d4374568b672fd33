//! The scheduling policies (PRESTO chapter 5): whether, and how often, a running transaction
//! gives its worker up to a more urgent request.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::Ordering;

use crate::queue::Level;
use crate::task::TaskControl;

/// How a node's transaction service treats a running transaction when a more urgent request
/// arrives and every worker is busy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Policy {
    /// Never preempt: a started transaction runs to its end (the baseline). Requests still
    /// start in priority order.
    #[default]
    None,
    /// Preempt the least urgent running transaction below the request's level, as often as
    /// it happens.
    Preemptive,
    /// Like `Preemptive`, but a transaction preempted `C_max` times is not preempted again:
    /// it runs to its end once it resumes.
    Cmax(u32),
    /// Like `Preemptive`, but a preempted transaction is promoted one level each time it is
    /// preempted (up to the highest), so work already done is not left behind forever; it
    /// runs at its own level again once it ends.
    Lazy,
}

/// Why a policy name did not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown scheduling policy {0:?} (expected none, preemptive, cmax or lazy)")]
pub struct PolicyError(pub String);

impl Policy {
    /// Its name, as `--sched` takes it.
    pub fn name(&self) -> &'static str {
        match self {
            Policy::None => "none",
            Policy::Preemptive => "preemptive",
            Policy::Cmax(_) => "cmax",
            Policy::Lazy => "lazy",
        }
    }

    /// Whether it ever preempts.
    pub fn preempts(&self) -> bool {
        *self != Policy::None
    }

    /// The policy named `name`; `cmax` takes its limit from `cmax`.
    pub fn parse(name: &str, cmax: u32) -> Result<Policy, PolicyError> {
        match name {
            "none" => Ok(Policy::None),
            "preemptive" => Ok(Policy::Preemptive),
            "cmax" => Ok(Policy::Cmax(cmax)),
            "lazy" => Ok(Policy::Lazy),
            other => Err(PolicyError(other.to_string())),
        }
    }

    /// Applies the policy to a task that has just been preempted (its count already
    /// includes this preemption); returns the level it waits at.
    pub(crate) fn after_preemption(&self, task: &TaskControl, highest: Level) -> Level {
        let count = task.preemptions.load(Ordering::Relaxed);
        match self {
            Policy::Cmax(limit) if count >= *limit => {
                task.preemptable.store(false, Ordering::Relaxed);
            }
            Policy::Lazy => {
                let promoted = task.level().saturating_add(1).min(highest);
                task.level.store(promoted, Ordering::Relaxed);
            }
            _ => {}
        }
        task.level()
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Cmax(n) => write!(f, "cmax({n})"),
            other => f.write_str(other.name()),
        }
    }
}

impl FromStr for Policy {
    type Err = PolicyError;

    /// `none`, `preemptive`, `lazy`, `cmax` (limit 3) or `cmax:N`.
    fn from_str(s: &str) -> Result<Policy, PolicyError> {
        match s.split_once(':') {
            Some(("cmax", n)) => n
                .parse()
                .map(Policy::Cmax)
                .map_err(|_| PolicyError(s.to_string())),
            _ => Policy::parse(s, DEFAULT_CMAX),
        }
    }
}

/// The C_max limit when none is given.
pub const DEFAULT_CMAX: u32 = 3;
