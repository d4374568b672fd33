//! One simulated run of a cluster of OSS nodes, and its checks: a serializable history, the
//! bank's total in every audit, converged replicas, no acknowledged local commit lost.

use std::collections::BTreeMap;

use atomos_core::history::list_append::ListOp;
use atomos_core::{TxError, TxOptions};
use atomos_protocols::oss::{CommitMode, OssBug, OssConfig};
use atomos_sim::workload::{check_list_run, ListAppendTxn};
use atomos_sim::{converged, Agreement, Faults, NodeId, Run, Sim, SimConfig};

use super::*;

pub(crate) struct Outcome {
    pub(crate) run: Run<Note>,
    /// Each live node: its replicated objects, its local counter and its count of transfers.
    pub(crate) finals: Vec<(NodeId, Vec<atomos_core::SnapshotObject>, u64, u64)>,
    /// Each live node's applied watermark and digest of what it applied, per domain.
    pub(crate) digests: Vec<(NodeId, [Option<Digest>; 2])>,
    /// The lists as the first live node ends with them.
    pub(crate) lists: BTreeMap<u64, Vec<u64>>,
    pub(crate) commits: u64,
    pub(crate) epochs: u64,
    /// Tokens the live nodes passed.
    pub(crate) passes: u64,
    /// The most control-log proposals a live node had in flight at once.
    pub(crate) control_in_flight_max: usize,
    /// Images of a domain installed, over every run of every node.
    pub(crate) images: u64,
    /// Compactions of the live nodes' logs in their last runs.
    pub(crate) compactions: u64,
}

/// A domain's applied watermark and the digest of what was applied through it.
pub(crate) type Digest = (u64, u64);

pub(crate) fn simulate(
    seed: u64,
    mode: CommitMode,
    bug: Option<OssBug>,
    faults: Faults,
) -> Outcome {
    simulate_modes(seed, [mode; NODES], bug, faults)
}

/// [`simulate`] with each node configured with its own commit mode.
pub(crate) fn simulate_modes(
    seed: u64,
    modes: [CommitMode; NODES],
    bug: Option<OssBug>,
    faults: Faults,
) -> Outcome {
    simulate_with(seed, modes, bug, faults, OssConfig::DEFAULT_HISTORY_MAX)
}

/// [`simulate_modes`] with nodes that keep `history_max` applied write sets per domain.
pub(crate) fn simulate_with(
    seed: u64,
    modes: [CommitMode; NODES],
    bug: Option<OssBug>,
    faults: Faults,
    history_max: usize,
) -> Outcome {
    let cfg = SimConfig {
        seed,
        nodes: NODES,
        crashable: NODES,
        tick_every: 10,
        fault_until: 4_000,
        settle: 8_000,
        faults,
    };
    let mut sim = Sim::new(cfg, move |boot| {
        let mode = modes[(boot.node as usize - 1) % NODES];
        Node::boot(seed, mode, bug, history_max, boot)
    });
    let run = sim.run();
    let mut finals = Vec::new();
    let mut lists = BTreeMap::new();
    let (mut commits, mut epochs) = (0, 0);
    let mut digests = Vec::new();
    let mut passes = 0;
    let mut control_in_flight_max = 0;
    let mut compactions = 0;
    for node in 1..=NODES as NodeId {
        if let Some(n) = sim.machine(node) {
            control_in_flight_max = control_in_flight_max.max(n.control_in_flight_max);
            let objects: Vec<_> = n
                .engine
                .snapshot_objects()
                .unwrap_or_default()
                .into_iter()
                .filter(|(k, _, _)| !k.as_bytes().starts_with(b"local/"))
                .map(|(k, _, v)| (k, 0, v))
                .collect();
            let opts = TxOptions {
                read_only: true,
                ..TxOptions::default()
            };
            let (count, transfers) = n
                .engine
                .run(&opts, |tx| {
                    Ok::<_, TxError>((
                        read_or_zero(tx, &counter())?,
                        read_or_zero(tx, &transfers_here())?,
                    ))
                })
                .unwrap_or((0, 0));
            // The shared lists as the first live node has them; each node's own lists.
            let keys: Vec<u64> = if lists.is_empty() {
                (0..8).collect()
            } else {
                Vec::new()
            };
            let own = (0..8).map(|k| LOCAL_LISTS * node + k);
            for k in keys.into_iter().chain(own) {
                let r = list_object(k);
                let l = n
                    .engine
                    .run(&opts, |tx| {
                        Ok::<_, TxError>(if tx.exists(&r)? {
                            tx.read(&r)?.clone()
                        } else {
                            Vec::new()
                        })
                    })
                    .unwrap_or_default();
                lists.insert(k, l);
            }
            let c = n.oss.counters();
            commits += c.commits + c.local_commits;
            epochs = epochs.max(c.epochs);
            passes += c.token_passes;
            compactions += c.compactions;

            finals.push((node, objects, count, transfers));
            digests.push((node, [0, 1].map(|d| n.oss.applied_digest(d))));
        }
    }
    let images = run
        .notes
        .iter()
        .filter(|(_, _, n)| matches!(n, Note::Image))
        .count() as u64;
    Outcome {
        run,
        finals,
        digests,
        lists,
        commits,
        epochs,
        passes,
        control_in_flight_max,
        images,
        compactions,
    }
}

pub(crate) fn check(o: &Outcome) -> Result<usize, String> {
    for (t, node, note) in &o.run.notes {
        if let Note::Audit { total } = note {
            if *total != INITIAL * ACCOUNTS as i64 {
                return Err(format!("node {node} at {t}: audit found {total}"));
            }
        }
    }
    // Every acknowledged local count survives on its node (its last run's, or a later one).
    let mut acked: BTreeMap<NodeId, u64> = BTreeMap::new();
    for (_, node, note) in &o.run.notes {
        if let Note::Counted(n) = note {
            let e = acked.entry(*node).or_default();
            *e = (*e).max(*n);
        }
    }
    // Node-local objects live on their node's disk alone: a wiped disk loses them.
    let wiped: Vec<NodeId> = o.run.wiped.iter().map(|(_, n)| *n).collect();
    for (node, _, count, _) in o.finals.iter().filter(|f| !wiped.contains(&f.0)) {
        if let Some(&a) = acked.get(node) {
            if *count < a {
                return Err(format!(
                    "node {node}: local counter {count}, {a} was acknowledged"
                ));
            }
        }
    }
    // The node-local part of every acknowledged transfer survives with its replicated part.
    let mut transferred: BTreeMap<NodeId, u64> = BTreeMap::new();
    for (_, node, note) in &o.run.notes {
        if let Note::Transferred = note {
            *transferred.entry(*node).or_default() += 1;
        }
    }
    for (node, _, _, transfers) in o.finals.iter().filter(|f| !wiped.contains(&f.0)) {
        let acked = transferred.get(node).copied().unwrap_or(0);
        if *transfers < acked {
            return Err(format!(
                "node {node}: {acked} transfers acknowledged, its local count says {transfers}"
            ));
        }
    }
    // Every acknowledged append is in the lists the cluster ends with.
    for (t, node, note) in &o.run.notes {
        if let Note::ListDone { ops, .. } = note {
            for op in ops {
                if let ListOp::Append { key, value } = op {
                    // A node's own lists die with its disk.
                    if *key >= LOCAL_LISTS && wiped.contains(&(key / LOCAL_LISTS)) {
                        continue;
                    }
                    if !o.lists.get(key).is_some_and(|l| l.contains(value)) {
                        return Err(format!(
                            "node {node} at {t}: append of {value} to list {key} acknowledged, \
                             then lost"
                        ));
                    }
                }
            }
        }
    }
    // No commit id was used twice: nodes that applied as far applied the same commits.
    let mut applied = Agreement::new("commits applied through an id (domain, id)");
    for (node, domains) in &o.digests {
        for (domain, digest) in domains.iter().enumerate() {
            if let Some((id, hash)) = digest {
                applied.see(*node, (domain, *id), *hash)?;
            }
        }
    }
    // The live nodes converged.
    converged(
        "objects",
        o.finals
            .iter()
            .map(|(node, objects, _, _)| (*node, objects)),
    )?;
    let aborted: std::collections::BTreeSet<u64> = o
        .run
        .notes
        .iter()
        .filter_map(|(_, _, n)| match n {
            Note::ListAborted { id } => Some(*id),
            _ => None,
        })
        .collect();
    // The lists of a node whose disk was wiped lost their history with it: left out.
    let kept = |ops: &[ListOp]| -> Vec<ListOp> {
        ops.iter()
            .filter(|op| {
                let (ListOp::Read { key, .. } | ListOp::Append { key, .. }) = op;
                *key < LOCAL_LISTS || !wiped.contains(&(key / LOCAL_LISTS))
            })
            .cloned()
            .collect()
    };
    let runs = o.run.notes.iter().filter_map(|(_, _, n)| match n {
        Note::ListRun(t) => Some(ListAppendTxn {
            id: t.id,
            ops: kept(&t.ops),
        }),
        _ => None,
    });
    let done = o.run.notes.iter().filter_map(|(_, node, n)| match n {
        Note::ListDone { id, ops } => Some((*node, *id, kept(ops))),
        _ => None,
    });
    check_list_run(runs, &aborted, done)
}
