//! The nesting experiments (HyflowCPP thesis 6.3-6.4): an update transaction made of several
//! inner operations, run flat, as closed-nested blocks, as checkpointed steps, or as
//! open-nested blocks with abstract locks and compensations.

use std::fmt;
use std::str::FromStr;

use atomos::{Node, Tx, TxError};

/// How an update transaction's inner operations are composed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum NestingModel {
    /// All operations in one transaction (a conflict re-runs everything).
    #[default]
    Flat,
    /// Each operation in a closed-nested block (a conflict in a block re-runs the block).
    Closed,
    /// Each operation a checkpointed step (a conflict resumes from the last valid step).
    Checkpoint,
    /// Each operation an open-nested block: it commits on its own, holding abstract locks on
    /// what it changed until the outer transaction ends, which compensates it if it aborts.
    Open,
}

impl NestingModel {
    /// Every model.
    pub const ALL: [NestingModel; 4] = [
        NestingModel::Flat,
        NestingModel::Closed,
        NestingModel::Checkpoint,
        NestingModel::Open,
    ];

    fn name(self) -> &'static str {
        match self {
            NestingModel::Flat => "flat",
            NestingModel::Closed => "closed",
            NestingModel::Checkpoint => "checkpoint",
            NestingModel::Open => "open",
        }
    }
}

impl fmt::Display for NestingModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for NestingModel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        NestingModel::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown nesting {s:?} (known: flat, closed, checkpoint, open)"))
    }
}

/// One inner operation: what it does inside a transaction (returning a count the workload
/// keeps, e.g. elements added), the abstract locks it needs under open nesting, and its
/// compensation.
pub trait InnerOp: Clone + Send + Sync + 'static {
    /// Runs the operation; returns its effect on the workload's counter.
    fn run(&self, tx: &mut Tx<'_>) -> Result<i64, TxError>;
    /// Abstract locks an open-nested run holds until the outer transaction ends.
    fn locks(&self) -> Vec<String>;
    /// The operation undoing a committed run whose effect was `effect`, if any.
    fn compensation(&self, effect: i64) -> Option<Self>;
}

/// Runs `ops` as one update transaction composed as `model` says; returns the sum of their
/// effects once it committed.
pub fn run_composed<O: InnerOp>(
    node: &Node,
    model: NestingModel,
    ops: &[O],
) -> Result<i64, TxError> {
    match model {
        NestingModel::Flat => node.atomically(|tx| {
            let mut sum = 0;
            for op in ops {
                sum += op.run(tx)?;
            }
            Ok(sum)
        }),
        NestingModel::Closed => node.atomically(|tx| {
            let mut sum = 0;
            for op in ops {
                sum += tx.nested(|tx| op.run(tx))?;
            }
            Ok(sum)
        }),
        NestingModel::Checkpoint => {
            let mut steps = node.steps(0i64);
            for op in ops {
                steps = steps.step(move |tx, sum| {
                    *sum += op.run(tx)?;
                    Ok(())
                });
            }
            steps.run()
        }
        NestingModel::Open => node.atomically(|tx| {
            let mut sum = 0;
            for op in ops {
                sum += tx.open_nested(|tx| {
                    for lock in op.locks() {
                        tx.abstract_lock(&lock)?;
                    }
                    let effect = op.run(tx)?;
                    if let Some(undo) = op.compensation(effect) {
                        tx.on_abort(move |tx| undo.run(tx).map(|_| ()));
                    }
                    Ok(effect)
                })?;
            }
            Ok(sum)
        }),
    }
}
