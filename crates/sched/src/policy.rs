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
    /// Like `Preemptive`, but a transaction preempted `C_max` times moves to the highest
    /// level (PRESTO 5.1): it resumes before anything else and is not preempted again.
    Cmax(u32),
    /// `Cmax` with lazy promotion: each preemption also raises the transaction's level by
    /// one, so a low-priority transaction gains on the work that keeps preempting it.
    Lazy(u32),
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
            Policy::Lazy(_) => "lazy",
        }
    }

    /// Its C_max, if it has one.
    pub fn cmax(&self) -> Option<u32> {
        match self {
            Policy::Cmax(n) | Policy::Lazy(n) => Some(*n),
            _ => None,
        }
    }

    /// Whether it ever preempts.
    pub fn preempts(&self) -> bool {
        *self != Policy::None
    }

    /// The policy named `name`; `cmax` and `lazy` take their limit from `cmax`.
    pub fn parse(name: &str, cmax: u32) -> Result<Policy, PolicyError> {
        match name {
            "none" => Ok(Policy::None),
            "preemptive" => Ok(Policy::Preemptive),
            "cmax" => Ok(Policy::Cmax(cmax)),
            "lazy" => Ok(Policy::Lazy(cmax)),
            other => Err(PolicyError(other.to_string())),
        }
    }

    /// Applies the policy to a task that has just been preempted (its count already
    /// includes this preemption); returns the level it waits at.
    pub(crate) fn after_preemption(&self, task: &TaskControl, highest: Level) -> Level {
        let count = task.preemptions.load(Ordering::Relaxed);
        let level = match self {
            Policy::Cmax(limit) | Policy::Lazy(limit) if count >= *limit => highest,
            Policy::Lazy(_) => task.level().saturating_add(1).min(highest),
            _ => task.level(),
        };
        task.level.store(level, Ordering::Relaxed);
        if level == highest {
            // Nothing is more urgent than the highest level: never preempted again.
            task.preemptable.store(false, Ordering::Relaxed);
        }
        level
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Cmax(n) => write!(f, "cmax({n})"),
            Policy::Lazy(n) => write!(f, "lazy({n})"),
            other => f.write_str(other.name()),
        }
    }
}

impl FromStr for Policy {
    type Err = PolicyError;

    /// `none`, `preemptive`, `cmax` or `lazy` (C_max [`DEFAULT_CMAX`]), or `cmax:N`,
    /// `lazy:N`.
    fn from_str(s: &str) -> Result<Policy, PolicyError> {
        match s.split_once(':') {
            Some((name, n)) => {
                let n = n.parse().map_err(|_| PolicyError(s.to_string()))?;
                match Policy::parse(name, n)? {
                    p @ (Policy::Cmax(_) | Policy::Lazy(_)) => Ok(p),
                    _ => Err(PolicyError(s.to_string())),
                }
            }
            None => Policy::parse(s, DEFAULT_CMAX),
        }
    }
}

/// The C_max limit when none is given (PRESTO's best settings were 4 and 8).
pub const DEFAULT_CMAX: u32 = 4;
