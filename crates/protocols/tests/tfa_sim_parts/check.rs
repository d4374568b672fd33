//! What a run ended with (owners, locks, balances, lists) and the checks of a run: a
//! serializable history, the bank's money whole, nothing lost unreported.

use atomos_core::history::list_append::ListOp;
use atomos_core::Key;
use atomos_protocols::tfa::Failure;
use atomos_sim::workload;
use atomos_sim::{Faults, NodeId};

use super::*;

/// What the run ended with.
pub(crate) struct Final {
    /// Each account's balance, `None` if it was lost.
    pub(crate) balances: Vec<Option<i64>>,
    /// Accounts nobody holds and nobody reports lost: never created.
    pub(crate) absent: Vec<u64>,
    /// Objects lost (reported so by their home).
    pub(crate) lost: usize,
    /// Each list as its one holder has it after the run; `None`: nobody holds it (lost, or
    /// never appended to).
    pub(crate) lists: Vec<Option<Vec<u64>>>,
    /// The lists their homes report lost.
    pub(crate) lost_lists: Vec<u64>,
}

/// After the run: every object owned by at most one node, one owned by none reported lost by
/// its home, no lock held, nothing unconfirmed.
pub(crate) fn final_state(machines: &[&SimNode]) -> Result<Final, String> {
    for m in machines {
        let held = m.tfa.objects().locks_held();
        if held > 0 {
            return Err(format!("node {} still holds {held} locks", m.me));
        }
        let held = m.tfa.abstract_locks_held();
        if held > 0 {
            return Err(format!(
                "node {} is home to {held} abstract locks no family holds",
                m.me
            ));
        }
        let families = m.tfa.abstract_families();
        if families > 0 {
            return Err(format!(
                "node {} counts {families} families as running after they all ended",
                m.me
            ));
        }
    }
    for m in machines {
        let (active, decided, tracking) = m.tfa.in_flight();
        let requests = m.tfa.pending_requests();
        if requests > 0 {
            return Err(format!(
                "node {} remembers {requests} requests: {:?}",
                m.me,
                m.tfa.describe_active()
            ));
        }
        if active + decided + tracking > 0 {
            return Err(format!(
                "node {}: {active} transactions, {decided} decisions, {tracking} directory \
                 updates still in flight {:?}",
                m.me,
                m.tfa.describe_active()
            ));
        }
    }
    let describe = |key: &Key| {
        machines
            .iter()
            .map(|m| m.tfa.describe_key(key))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let owners = |key: &Key| -> Vec<(NodeId, Option<Vec<u8>>)> {
        machines
            .iter()
            .filter_map(|m| {
                m.tfa
                    .objects()
                    .get(key)
                    .filter(|h| h.version > 0)
                    .map(|h| (m.me, h.value.map(<[u8]>::to_vec)))
            })
            .collect()
    };
    let reported_lost = |key: &Key| {
        machines
            .iter()
            .any(|m| m.tfa.home(key) == m.me && m.tfa.home_record(key).is_some_and(|r| r.lost))
    };
    let mut lost = 0;
    let (mut lists, mut lost_lists) = (Vec::new(), Vec::new());
    for i in 0..LIST_KEYS {
        let key = list(i);
        let o = owners(&key);
        if o.len() > 1 {
            return Err(format!("list {i} has owners {o:?}\n{}", describe(&key)));
        }
        if o.is_empty() && reported_lost(&key) {
            lost += 1;
            lost_lists.push(i);
        }
        lists.push(match o.as_slice() {
            [(_, Some(v))] => Some(dec(v)),
            _ => None,
        });
    }
    let mut balances = Vec::new();
    let mut absent = Vec::new();
    for i in 0..ACCOUNTS {
        let key = account(i);
        match owners(&key).as_slice() {
            [(_, Some(v))] => balances.push(Some(dec(v))),
            [] if reported_lost(&key) => {
                lost += 1;
                balances.push(None);
            }
            [] => {
                absent.push(i);
                balances.push(None);
            }
            other => {
                return Err(format!(
                    "account {i} has owners {other:?}\n{}",
                    describe(&key)
                ))
            }
        }
    }
    Ok(Final {
        balances,
        absent,
        lost,
        lists,
        lost_lists,
    })
}

/// When the final read of list `key` is asked for (once the faults are over and every node is
/// back).
pub(crate) fn final_read_at(key: u64) -> u64 {
    9_000 + key * 10
}

pub(crate) fn check(o: &Outcome) -> Result<(), String> {
    // Each committed list transaction, with when it committed.
    let committed: Vec<(u64, NodeId, u64, Vec<ListOp>)> = o
        .run
        .notes
        .iter()
        .filter_map(|(t, node, n)| match n {
            Note::Committed {
                id,
                answer: Answer::Lists(ops),
            } => Some((*t, *node, *id, ops.clone())),
            _ => None,
        })
        .collect();
    let done: Vec<(NodeId, u64, Vec<ListOp>)> = committed
        .iter()
        .map(|(_, node, id, ops)| (*node, *id, ops.clone()))
        .collect();
    // A failed transaction committed nothing: it is left out of the history. Only the faults
    // explain a failure: an object lost with a crashed node, or a node that did not answer.
    let failures: Vec<(u64, &Failure)> = o
        .run
        .notes
        .iter()
        .filter_map(|(_, _, n)| match n {
            Note::Failed { id, failure } => Some((*id, failure)),
            _ => None,
        })
        .collect();
    let setup_done = o
        .run
        .notes
        .iter()
        .any(|(_, _, n)| matches!(n, Note::Committed { id: 0, .. }));
    for (_, node, n) in &o.run.notes {
        if let (Note::NeverCreated { id }, true) = (n, setup_done) {
            return Err(format!(
                "transaction {id} on node {node} never saw the accounts"
            ));
        }
    }
    for (id, failure) in &failures {
        let explained = match failure {
            Failure::Lost { .. } => true,
            Failure::Unavailable { .. } => *id < FINAL_READ,
            _ => false,
        };
        if !explained {
            return Err(format!("transaction {id} failed: {failure:?}"));
        }
    }
    let failed: std::collections::BTreeSet<u64> = failures.iter().map(|(id, _)| *id).collect();
    workload::check_list_run(o.submitted.iter().cloned(), &failed, done.iter().cloned())?;
    // Every append committed before the final read of its list was asked for is seen by it,
    // unless the list was lost. (One still retrying then may commit after it: the history
    // check above orders those.)
    for key in 0..LIST_KEYS {
        let final_read = done.iter().find(|(_, id, _)| *id == FINAL_READ + key);
        let seen = match final_read.map(|(_, _, ops)| ops.as_slice()) {
            Some([ListOp::Read { seen, .. }]) => seen,
            Some(other) => return Err(format!("final read of list {key} did {other:?}")),
            None if failed.contains(&(FINAL_READ + key)) => continue, // lost, and told so
            None => return Err(format!("the final read of list {key} never finished")),
        };
        for (_, _, id, ops) in committed.iter().filter(|c| c.0 < final_read_at(key)) {
            for op in ops {
                if let ListOp::Append { key: k, value } = op {
                    if *k == key && !seen.contains(value) {
                        return Err(format!(
                            "append {value} to list {key} by committed transaction {id} is \
                             lost: the final read saw {seen:?}"
                        ));
                    }
                }
            }
        }
    }
    let total = INITIAL * ACCOUNTS as i64;
    for (t, node, n) in &o.run.notes {
        if let Note::Committed {
            answer: Answer::Audit(b),
            ..
        } = n
        {
            if b.iter().sum::<i64>() != total {
                return Err(format!("audit at {t} on node {node} saw {b:?}"));
            }
        }
    }
    let end = o.end.as_ref().map_err(Clone::clone)?;
    // Every committed append, however late, is in its list's last copy, unless the list was
    // reported lost (a copy lost and re-created from nothing would miss the older appends:
    // lost lists are never re-created).
    for (_, id, ops) in &done {
        for op in ops {
            if let ListOp::Append { key, value } = op {
                let last = end.lists.get(*key as usize).and_then(Option::as_ref);
                let kept = last.is_some_and(|l| l.contains(value));
                if !kept && !end.lost_lists.contains(key) {
                    return Err(format!(
                        "append {value} to list {key} by committed transaction {id} is not \
                         in the list's last copy {last:?}"
                    ));
                }
            }
        }
    }
    if setup_done && !end.absent.is_empty() {
        return Err(format!(
            "accounts {:?} were created, nobody holds them, and nobody reports them lost",
            end.absent
        ));
    }
    if end.balances.iter().all(Option::is_some) {
        let sum: i64 = end.balances.iter().flatten().sum();
        if sum != total {
            return Err(format!("final balances {:?}", end.balances));
        }
    }
    check_exclusion(o, o.nodes)?;
    Ok(())
}

pub(crate) fn committed(o: &Outcome) -> usize {
    o.run
        .notes
        .iter()
        .filter(|(_, _, n)| matches!(n, Note::Committed { .. }))
        .count()
}

/// Every fault but crashes (nor failed fsyncs, which crash a node).
pub(crate) fn network_faults() -> Faults {
    Faults {
        crash: 0.0,
        fsync_fail: 0.0,
        ..Faults::harsh()
    }
}

/// Every fault, crashes included (a node crashes about once a run).
pub(crate) fn all_faults() -> Faults {
    Faults {
        crash: 0.003,
        ..Faults::harsh()
    }
}

pub(crate) fn crashes(o: &Outcome) -> usize {
    o.run.crashes.len()
}
