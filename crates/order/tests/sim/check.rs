//! What every run must show (see the module docs of `sim.rs`).

use std::collections::{BTreeMap, BTreeSet};

use atomos_order::{Delivery, Register, Request, StateMachine};
use atomos_sim::{Agreement, NodeId};

use crate::harness::{Note, Outcome};

pub fn check(o: &Outcome) -> Result<(), String> {
    // seq -> the requests finally delivered there (by any replica, any incarnation).
    let mut final_order = Agreement::new("requests finally delivered");
    // seq -> the log's time there, as the first replica to deliver it finally said.
    let mut times = Agreement::new("the log's times");
    // seq -> the membership in force from there on.
    let mut memberships = Agreement::new("memberships");
    #[derive(Default)]
    struct View {
        opt: BTreeMap<u64, Vec<Request>>,
        opt_next: u64,
        final_next: u64,
    }
    if let Some((t, node, e)) = o.run.failures.first() {
        return Err(format!("replica {node} failed at {t}: {e}"));
    }
    // Only a replica whose log was damaged may refuse to start, and it must.
    let corrupted: BTreeSet<NodeId> = o.run.corrupted.iter().map(|(_, n)| *n).collect();
    let refused: BTreeSet<NodeId> = o.run.refused.iter().map(|(_, n, _)| *n).collect();
    if corrupted != refused {
        return Err(format!(
            "damaged logs on {corrupted:?}, but refused to start: {:?}",
            o.run.refused
        ));
    }
    let mut views: BTreeMap<NodeId, View> = BTreeMap::new();
    for (t, node, note) in &o.run.notes {
        let v = views.entry(*node).or_default();
        match note {
            Note::Started { base } => {
                *v = View {
                    opt: BTreeMap::new(),
                    opt_next: base + 1,
                    final_next: base + 1,
                };
            }
            Note::Delivered(Delivery::Opt { seq, requests }) => {
                if *seq != v.opt_next {
                    return Err(format!(
                        "node {node} at {t}: opt-delivered {seq}, expected {}",
                        v.opt_next
                    ));
                }
                v.opt.insert(*seq, requests.clone());
                v.opt_next += 1;
            }
            Note::Delivered(Delivery::Revoke { from }) => {
                if *from < v.final_next {
                    return Err(format!("node {node} at {t}: revoked final entry {from}"));
                }
                v.opt.split_off(from);
                v.opt_next = *from;
            }
            Note::Delivered(Delivery::Installed { seq }) => {
                v.opt.clear();
                v.opt_next = seq + 1;
                v.final_next = seq + 1;
            }
            Note::Delivered(Delivery::Alarm { seq, text }) => {
                return Err(format!("node {node} at {t}: alarm at entry {seq}: {text}"));
            }
            Note::Delivered(Delivery::Final { seq, time_ms }) => {
                times
                    .see(*node, *seq, *time_ms)
                    .map_err(|e| format!("at {t}: {e}"))?;
                if let Some(prev) = seq.checked_sub(1).and_then(|p| times.get(&p)) {
                    if prev > time_ms {
                        return Err(format!("the log's time went back at {seq}"));
                    }
                }
                if *seq != v.final_next {
                    return Err(format!(
                        "node {node} at {t}: final-delivered {seq}, expected {}",
                        v.final_next
                    ));
                }
                let Some(requests) = v.opt.remove(seq) else {
                    return Err(format!(
                        "node {node} at {t}: final-delivered {seq} before opt-delivering it"
                    ));
                };
                final_order
                    .see(*node, *seq, requests)
                    .map_err(|e| format!("at {t}: {e}"))?;
                v.final_next += 1;
            }
            Note::Delivered(Delivery::Membership { seq, membership }) => {
                memberships
                    .see(*node, *seq, membership.clone())
                    .map_err(|e| format!("at {t}: {e}"))?;
            }
            Note::Delivered(Delivery::MemberChange { .. } | Delivery::EncodeSnapshot { .. })
            | Note::Proposed(_)
            | Note::Done { .. }
            | Note::Expired { .. }
            | Note::Unknown { .. } => {}
        }
    }
    let (final_order, times) = (final_order.into_values(), times.into_values());
    // Integrity: at most once, only what clients sent, and only before its deadline.
    let mut seen = BTreeSet::new();
    for (seq, requests) in &final_order {
        for r in requests {
            if r.deadline_ms < times[seq] {
                return Err(format!(
                    "request {}:{} ran at {seq} where the log's time {} is past its deadline {}",
                    r.client, r.seq, times[seq], r.deadline_ms
                ));
            }
            if !seen.insert((r.client, r.seq)) {
                return Err(format!(
                    "request {}:{} delivered twice (again at {seq})",
                    r.client, r.seq
                ));
            }
            if o.payloads.get(&(r.client, r.seq)) != Some(&r.payload) {
                return Err(format!(
                    "request {}:{} was not sent like that",
                    r.client, r.seq
                ));
            }
        }
    }
    // A request reported expired never ran.
    for (_, _, note) in &o.run.notes {
        if let Note::Expired { client, seq } = note {
            if seen.contains(&(*client, *seq)) {
                return Err(format!(
                    "request {client}:{seq} was reported expired, but it ran"
                ));
            }
        }
    }
    // An outcome reported unknown is of a request a client sent.
    for (_, _, note) in &o.run.notes {
        if let Note::Unknown { client, seq } = note {
            if !o.payloads.contains_key(&(*client, *seq)) {
                return Err(format!(
                    "request {client}:{seq} was reported unknown, but no client sent it"
                ));
            }
        }
    }
    // Validity: every request answered once the faults stopped.
    if o.unanswered > 0 {
        return Err(format!("{} requests never answered", o.unanswered));
    }
    // Answers agree with the final order.
    let contiguous = final_order.keys().copied().eq(1..=final_order.len() as u64);
    let answered = o
        .run
        .notes
        .iter()
        .any(|(_, _, n)| matches!(n, Note::Done { .. }));
    if answered && !contiguous {
        // A snapshot install skips positions in one replica's view; some replica (or an
        // earlier incarnation) must still have delivered each one.
        let missing: Vec<u64> = (1..=final_order.keys().max().copied().unwrap_or(0))
            .filter(|s| !final_order.contains_key(s))
            .collect();
        return Err(format!(
            "positions {missing:?} were finally delivered by no replica: answers cannot be checked"
        ));
    }
    if contiguous {
        let mut reg = Register::new();
        let mut answers = BTreeMap::new();
        for requests in final_order.values() {
            for r in requests {
                answers.insert((r.client, r.seq), reg.apply(r));
            }
        }
        for (_, _, note) in &o.run.notes {
            if let Note::Done {
                client,
                seq,
                response,
            } = note
            {
                if answers.get(&(*client, *seq)) != Some(response) {
                    return Err(format!(
                        "answer to {client}:{seq} disagrees with the final order"
                    ));
                }
            }
        }
    }
    // A final delivery applies what the optimistic one named (what a speculating machine
    // relies on), as each replica's machine saw it.
    for (_, reg) in &o.finals {
        let (_, mismatched) = reg.speculation();
        if mismatched > 0 {
            return Err(format!(
                "{mismatched} requests applied at their final delivery differ from their \
                 entry's optimistic delivery"
            ));
        }
    }
    // Reads: what a replica's local readers saw at each moment is what the final order implies
    // at the position it had applied (a read of an entry a crash took back would differ).
    let mut replayed = Register::new();
    let mut at = 0;
    let mut reads: Vec<&(NodeId, u64, Register)> = o.reads.iter().collect();
    reads.sort_by_key(|(_, applied, _)| *applied);
    for (node, applied, seen) in reads {
        if !(at + 1..=*applied).all(|s| final_order.contains_key(&s)) {
            break;
        }
        for (_, requests) in final_order
            .range(at + 1..)
            .take_while(|(s, _)| **s <= *applied)
        {
            for r in requests {
                replayed.apply(r);
            }
        }
        at = *applied;
        if *seen != replayed {
            return Err(format!(
                "a reader on replica {node} saw a state at {applied} that the final order does \
                 not imply: {seen:?} vs {replayed:?}"
            ));
        }
    }
    // Recovery: a replica rebuilt from its disk alone holds what the final order implies at
    // the position it reaches (replaying its log decides every duplicate as the live run did).
    for (node, rebuilt) in &o.recovered {
        match rebuilt {
            Ok((reg, applied)) => {
                if !(1..=*applied).all(|s| final_order.contains_key(&s)) {
                    continue;
                }
                let mut replayed = Register::new();
                for (_, requests) in final_order.iter().take_while(|(s, _)| **s <= *applied) {
                    for r in requests {
                        replayed.apply(r);
                    }
                }
                if *reg != replayed {
                    return Err(format!(
                        "replica {node} rebuilt from its disk differs from the final order at \
                         {applied}: {reg:?} vs {replayed:?}"
                    ));
                }
            }
            Err(e) if !corrupted.contains(node) => {
                return Err(format!(
                    "replica {node} cannot be rebuilt from its disk: {e}"
                ));
            }
            Err(_) => {}
        }
    }
    // Convergence: every live replica ends at the same place with the same state.
    if let Some((next, reg)) = o.finals.first() {
        for (n, r) in &o.finals {
            if (n, r) != (next, reg) {
                return Err(format!(
                    "replicas ended apart: at {n} vs {next}:\n{}",
                    o.states.join("\n")
                ));
            }
        }
    }
    Ok(())
}

pub fn count(o: &Outcome, f: impl Fn(&Note) -> bool) -> usize {
    o.run.notes.iter().filter(|(_, _, n)| f(n)).count()
}
