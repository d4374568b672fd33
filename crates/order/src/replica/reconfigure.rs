//! Membership changes. The leader proposes a change as a raft-rs `ConfChangeV2` entry (a
//! learner's context, what hosts need to reach it, rides in the entry's context); every
//! replica applies it when the entry is finally delivered, in log order, so every replica
//! counts the same voters from the same position on. raft-rs learns of it then too (it is
//! told an entry is applied only once it is, see `sync_applied`), which keeps one change at a
//! time and takes the cluster out of a joint configuration on its own.
//!
//! A replica added as a learner gets its first state from a snapshot: it knows no
//! configuration, so it takes no entries from the log's start (the founding configuration is
//! not in the log), and a leader's snapshot taken before the change does not name it. So the
//! leader takes a snapshot when raft-rs wants to send it one the latest cannot serve
//! (`LogStore::take_snapshot_wanted`): only the replica that sends one encodes the state,
//! whichever replica leads by then. A replica whose log still starts at the founding takes a
//! snapshot when it applies a change, so that its log no longer reaches back to entries a
//! learner would be sent. A restart starts from the latest snapshot's configuration (or the
//! founding one) and applies the changes after it again as it delivers the log again, as it
//! did the first time.

use std::collections::BTreeMap;

use prost::Message as _;
use raft::eraftpb::{
    ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2, Entry, EntryType,
};

use atomos_seam::Output;

use super::consensus::warn;
use super::Replica;
use crate::membership::{ChangeRefused, MemberChange, Membership};
use crate::types::{Action, Addr, Delivery, OrderMsg, StateMachine};

/// What the leader knows of how far the replicas have finally delivered, and the positions
/// changes wait for. Forgotten at every change applied (targets, and the reports of replicas
/// no longer members) and for a replica that lost its log.
#[derive(Debug, Default)]
pub(super) struct Progress {
    /// Replica -> the position it last reported delivering through ([`OrderMsg::Delivered`]).
    delivered: BTreeMap<Addr, u64>,
    /// Changes asked for since the last change applied (the latest [`MAX_TARGETS`]), each with
    /// the leader's commit when it was first asked for: the replicas it needs must have
    /// delivered that far. Fixed at the first ask, so an operator who asks again while the
    /// cluster commits on is let through once they got there, whatever else is asked between.
    targets: Vec<(MemberChange, u64)>,
}

/// How many changes asked for keep their target.
const MAX_TARGETS: usize = 8;

/// A configuration entry: the change it carries (or why it does not decode) and its context.
#[derive(Debug)]
pub(super) struct ConfigEntry {
    change: Result<ConfChangeV2, String>,
    context: Vec<u8>,
}

impl ConfigEntry {
    /// The configuration change entry `e` carries, if it is one.
    pub(super) fn of(e: &Entry) -> Option<ConfigEntry> {
        if e.get_entry_type() != EntryType::EntryConfChangeV2 {
            return None;
        }
        Some(ConfigEntry {
            change: ConfChangeV2::decode(e.data.as_slice()).map_err(|e| e.to_string()),
            context: e.context.clone(),
        })
    }
}

/// `cc` if it is a change replicas propose: an automatic transition (one that leaves a joint
/// configuration on its own) of changes of known kinds. raft-rs's getters abort the process
/// on a kind they do not know, and an explicit transition would stay joint for good.
fn proposable(cc: ConfChangeV2) -> Result<ConfChangeV2, String> {
    if ConfChangeTransition::from_i32(cc.transition) != Some(ConfChangeTransition::Auto) {
        return Err(format!("transition {} is not automatic", cc.transition));
    }
    if let Some(c) = cc
        .changes
        .iter()
        .find(|c| ConfChangeType::from_i32(c.change_type).is_none())
    {
        return Err(format!("unknown kind of change {}", c.change_type));
    }
    Ok(cc)
}

fn single(id: Addr, kind: ConfChangeType) -> ConfChangeSingle {
    ConfChangeSingle {
        change_type: kind as i32,
        node_id: id,
    }
}

impl<S: StateMachine> Replica<S> {
    /// A host asks for `change`: proposed if this replica leads and the change makes sense
    /// now; the answer goes out as a [`Delivery::MemberChange`].
    pub(super) fn change_membership(
        &mut self,
        ticket: u64,
        change: MemberChange,
        out: &mut Vec<Action>,
    ) {
        let result = self.propose_change(change);
        out.push(Output::Deliver(Delivery::MemberChange { ticket, result }));
    }

    fn propose_change(&mut self, change: MemberChange) -> Result<u64, ChangeRefused> {
        if !self.is_leader() {
            return Err(ChangeRefused::NotLeader {
                leader: self.leader(),
            });
        }
        if self.raft.raft.has_pending_conf() || self.members.is_joint() {
            return Err(ChangeRefused::UnderWay);
        }
        let m = &self.members;
        let (changes, context) = match change {
            MemberChange::AddLearner { id, context } => {
                if id == 0 {
                    return Err(ChangeRefused::Raft("a replica id is never 0".into()));
                }
                if m.contains(id) {
                    return Err(ChangeRefused::AlreadyMember(id));
                }
                (vec![single(id, ConfChangeType::AddLearnerNode)], context)
            }
            MemberChange::Promote { id } => {
                if !m.learners.contains(&id) {
                    return Err(ChangeRefused::NotLearner(id));
                }
                let target = self.target_of(&change);
                self.learner_caught_up(id, target)?;
                (vec![single(id, ConfChangeType::AddNode)], Vec::new())
            }
            MemberChange::Remove { id } => {
                if !m.contains(id) {
                    return Err(ChangeRefused::NotMember(id));
                }
                if m.voters == [id] {
                    return Err(ChangeRefused::LastVoter);
                }
                if m.voters.contains(&id) {
                    let left: Vec<Addr> = m.voters.iter().copied().filter(|&v| v != id).collect();
                    let target = self.target_of(&change);
                    self.voters_caught_up(&left, target)?;
                }
                (vec![single(id, ConfChangeType::RemoveNode)], Vec::new())
            }
            MemberChange::Replace { remove, add } => {
                if !m.voters.contains(&remove) {
                    return Err(ChangeRefused::NotVoter(remove));
                }
                if !m.learners.contains(&add) {
                    return Err(ChangeRefused::NotLearner(add));
                }
                let mut left: Vec<Addr> =
                    m.voters.iter().copied().filter(|&v| v != remove).collect();
                left.push(add);
                let target = self.target_of(&change);
                self.learner_caught_up(add, target)?;
                self.voters_caught_up(&left, target)?;
                let changes = vec![
                    single(add, ConfChangeType::AddNode),
                    single(remove, ConfChangeType::RemoveNode),
                ];
                (changes, Vec::new())
            }
        };
        let cc = ConfChangeV2 {
            transition: ConfChangeTransition::Auto as i32,
            changes,
            context: Vec::new(),
        };
        let before = self.raft.raft.raft_log.last_index();
        self.raft
            .propose_conf_change(context, cc)
            .map_err(|e| ChangeRefused::Raft(e.to_string()))?;
        let at = self.raft.raft.raft_log.last_index();
        if at == before {
            return Err(ChangeRefused::Raft("the proposal was dropped".into()));
        }
        Ok(at)
    }

    /// The position the replicas `change` needs must have delivered through: the commit when
    /// it was first asked for (see [`Progress::target`]).
    fn target_of(&mut self, change: &MemberChange) -> u64 {
        let targets = &mut self.progress.targets;
        if let Some((_, target)) = targets.iter().find(|(asked, _)| asked == change) {
            return *target;
        }
        let commit = self.raft.raft.raft_log.committed;
        if targets.len() == MAX_TARGETS {
            targets.remove(0);
        }
        targets.push((change.clone(), commit));
        commit
    }

    /// How far replica `id` has finally delivered, as far as this leader knows: what it
    /// reported, but never past what Raft knows its log to hold (raft-rs forgets that when
    /// this replica becomes leader, and a replica that lost its log lowers it: a report from
    /// before then does not count).
    fn delivered_by(&self, id: Addr) -> u64 {
        if id == self.cfg.id {
            return self.delivery.final_next - 1;
        }
        let reported = self.progress.delivered.get(&id).copied().unwrap_or(0);
        let matched = self.raft.raft.prs().get(id).map_or(0, |p| p.matched);
        reported.min(matched)
    }

    /// Replica `id` lost its log: what it reported before counts no more.
    pub(super) fn forget_progress(&mut self, id: Addr) {
        self.progress.delivered.remove(&id);
    }

    /// Whether learner `id` delivered through `target`: then, as a voter, it holds every
    /// batch ordered that far (or the state they made).
    fn learner_caught_up(&self, id: Addr, target: u64) -> Result<(), ChangeRefused> {
        let delivered = self.delivered_by(id);
        if delivered < target {
            return Err(ChangeRefused::LearnerBehind {
                id,
                delivered,
                target,
            });
        }
        Ok(())
    }

    /// Whether enough of `voters` (those a change leaves) delivered through `target` that
    /// every majority of them holds one that did: what was ordered that far stays held by
    /// every quorum, though the change removes a voter that held a batch.
    fn voters_caught_up(&self, voters: &[Addr], target: u64) -> Result<(), ChangeRefused> {
        let majority = voters.len() / 2 + 1;
        let needed = voters.len() + 1 - majority;
        let caught_up = voters
            .iter()
            .filter(|&&v| self.delivered_by(v) >= target)
            .count();
        if caught_up < needed {
            return Err(ChangeRefused::VotersBehind {
                caught_up,
                needed,
                target,
            });
        }
        Ok(())
    }

    /// A replica reports how far it has delivered: kept while this replica leads, of members.
    pub(super) fn on_delivered(&mut self, from: Addr, through: u64) {
        if self.is_leader() && self.members.contains(from) {
            self.progress.delivered.insert(from, through);
        }
    }

    /// Every `retry_ticks` ticks, a replica that follows a leader tells it how far it has
    /// delivered.
    pub(super) fn report_progress(&mut self, out: &mut Vec<Action>) {
        if !self.ticks.is_multiple_of(self.cfg.retry_ticks.max(1)) || self.is_leader() {
            return;
        }
        if let Some(leader) = self.leader() {
            let through = self.delivery.final_next - 1;
            out.push(Output::Send {
                to: leader,
                msg: OrderMsg::Delivered { through },
            });
        }
    }

    /// Applies the configuration entry finally delivered at `seq`. A change raft-rs refuses
    /// (it no longer fits the configuration it finds) is refused on every replica alike: all
    /// apply the same entries to the same configuration.
    pub(super) fn apply_change(&mut self, seq: u64, entry: ConfigEntry, out: &mut Vec<Action>) {
        let cc = match entry.change.and_then(proposable) {
            Ok(cc) => cc,
            Err(e) => {
                return warn(
                    out,
                    format!("membership change at {seq} cannot be applied: skipped: {e}"),
                )
            }
        };
        let was_leader = self.is_leader();
        let cs = match self.raft.apply_conf_change(&cc) {
            Ok(cs) => cs,
            Err(e) => {
                return warn(
                    out,
                    format!("membership change at {seq} does not apply: skipped: {e}"),
                )
            }
        };
        let added: Vec<Addr> = cc
            .changes
            .iter()
            .filter(|c| c.change_type == ConfChangeType::AddLearnerNode as i32)
            .map(|c| c.node_id)
            .collect();
        let before = self.members.all();
        let mut removed = std::mem::take(&mut self.members.removed);
        let mut contexts = std::mem::take(&mut self.members.contexts);
        for &id in &added {
            contexts.insert(id, entry.context.clone());
        }
        let now = Membership::of(&cs, &contexts);
        removed.extend(before.into_iter().filter(|&id| !now.contains(id)));
        self.members = now.with_removed(removed);
        self.raft.mut_store().set_conf_state(cs, seq, &added);
        // What changes waited for was measured against the configuration before.
        self.progress.targets.clear();
        let members = &self.members;
        self.progress
            .delivered
            .retain(|&id, _| members.contains(id));
        self.stats.membership_changes += 1;
        // See the module's doc.
        if self.raft.store().snapshot_index() == 0 {
            self.snapshot_due = true;
        }
        if was_leader && !self.members.votes(self.cfg.id) {
            // Removed while leading: the others elect a leader among themselves.
            let term = self.raft.raft.term;
            self.raft.raft.become_follower(term, raft::INVALID_ID);
            warn(
                out,
                format!(
                    "replica {} was removed while leading: it stepped down",
                    self.cfg.id
                ),
            );
        }
        out.push(Output::Deliver(Delivery::Membership {
            seq,
            membership: self.members.clone(),
        }));
    }

    /// Applies the configuration entries of this replica's log from `from` through `to`
    /// (a snapshot adopted in their place skips their delivery, but raft-rs must know of them).
    pub(super) fn apply_changes_in_log(&mut self, from: u64, to: u64, out: &mut Vec<Action>) {
        for seq in from..=to {
            let entry = self.raft.store().entry(seq).and_then(ConfigEntry::of);
            if let Some(entry) = entry {
                self.apply_change(seq, entry, out);
            }
        }
    }
}
