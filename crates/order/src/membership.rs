//! Who orders: the replicas of a configuration, as the log decides it. Changes go through
//! raft-rs's configuration changes (`ConfChangeV2`, joint consensus when a change swaps
//! voters); this module holds the vocabulary (what a host may ask, why the leader refuses)
//! and the configuration a replica is in, with the quorum rule S-Paxos dissemination uses.

use std::collections::{BTreeMap, BTreeSet};

use raft::eraftpb::{ConfChangeSingle, ConfChangeType, ConfState};
use raft::{Changer, ProgressTracker};

use crate::types::Addr;

/// A change of the replicas, asked of the leader ([`crate::Command::ChangeMembership`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberChange {
    /// Adds replica `id` as a learner: it receives the log and every batch and votes on
    /// nothing. `context` is what the hosts need to reach it (its address and key, say):
    /// opaque here, kept with the membership while `id` is a member.
    AddLearner {
        /// The new replica.
        id: Addr,
        /// What hosts need to know of it.
        context: Vec<u8>,
    },
    /// Makes learner `id` a voter. Refused until it delivered through the leader's commit at
    /// the change's first ask ([`ChangeRefused::LearnerBehind`]).
    Promote {
        /// The learner.
        id: Addr,
    },
    /// Removes replica `id`, voter or learner (the leader too: it steps down once the change
    /// applies). Refused if no voter would remain, and, for a voter, until enough of the voters
    /// left delivered through the leader's commit at the change's first ask
    /// ([`ChangeRefused::VotersBehind`]).
    Remove {
        /// The replica.
        id: Addr,
    },
    /// Promotes learner `add` and removes voter `remove` in one change, through a joint
    /// configuration (both majorities decide until the cluster leaves it, which it does on its
    /// own). Refused as `Promote` and `Remove` are.
    Replace {
        /// The voter that goes.
        remove: Addr,
        /// The learner that takes its place.
        add: Addr,
    },
}

/// Why the leader did not propose a change (nothing changed).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChangeRefused {
    /// Only the leader proposes changes.
    #[error("this replica does not lead (the leader is {leader:?}): ask the leader")]
    NotLeader {
        /// The leader this replica follows, if it knows one.
        leader: Option<Addr>,
    },
    /// An earlier change is not applied yet, or the cluster is in a joint configuration.
    #[error("a membership change is under way: wait until it applies")]
    UnderWay,
    /// The replica to add is a member already.
    #[error("replica {0} is a member already")]
    AlreadyMember(Addr),
    /// The replica named is not a member.
    #[error("replica {0} is not a member")]
    NotMember(Addr),
    /// The replica to promote is not a learner.
    #[error("replica {0} is not a learner")]
    NotLearner(Addr),
    /// The replica to remove in a replacement is not a voter.
    #[error("replica {0} is not a voter")]
    NotVoter(Addr),
    /// The learner has not delivered what the cluster had committed when the change was
    /// first asked for: as a voter it could count in a majority that lacks batches of it.
    #[error(
        "learner {id} delivered the log to {delivered}, behind {target}: wait until it catches up"
    )]
    LearnerBehind {
        /// The learner.
        id: Addr,
        /// How far it reported finally delivering.
        delivered: u64,
        /// The leader's commit when the change was first asked for.
        target: u64,
    },
    /// Too few of the voters the change leaves have delivered what the cluster had committed
    /// when it was first asked for: some majority of them could lack batches of it.
    #[error("{caught_up} of the voters the change leaves delivered the log to {target}, {needed} must: wait until they catch up")]
    VotersBehind {
        /// Voters left that delivered that far.
        caught_up: usize,
        /// How many must: enough that every majority of the voters left holds one.
        needed: usize,
        /// The leader's commit when the change was first asked for.
        target: u64,
    },
    /// The change would leave no voter.
    #[error("the change would leave no voter")]
    LastVoter,
    /// raft-rs refused it.
    #[error("raft refused the change: {0}")]
    Raft(String),
}

/// The configuration a replica is in after some log position: who votes, who learns, and
/// what hosts know of the members that joined through the log. Lists are sorted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    /// The voters (of the incoming configuration while joint).
    pub voters: Vec<Addr>,
    /// The voters of the outgoing configuration while joint; empty otherwise.
    pub outgoing: Vec<Addr>,
    /// The learners (those about to become learners when a joint configuration is left
    /// included).
    pub learners: Vec<Addr>,
    /// The context each member that joined through the log was added with.
    pub contexts: BTreeMap<Addr, Vec<u8>>,
    /// The replicas changes removed (and did not add again since): hosts refuse them even
    /// where an old configuration file still lists them.
    pub removed: Vec<Addr>,
}

impl Membership {
    /// The membership of raft-rs configuration `cs`, with the contexts of its members among
    /// `contexts`.
    pub(crate) fn of(cs: &ConfState, contexts: &BTreeMap<Addr, Vec<u8>>) -> Membership {
        let sorted = |ids: &[u64]| {
            let set: BTreeSet<u64> = ids.iter().copied().collect();
            set.into_iter().collect::<Vec<_>>()
        };
        let mut learners = cs.learners.clone();
        learners.extend_from_slice(&cs.learners_next);
        let mut m = Membership {
            voters: sorted(&cs.voters),
            outgoing: sorted(&cs.voters_outgoing),
            learners: sorted(&learners),
            contexts: BTreeMap::new(),
            removed: Vec::new(),
        };
        m.contexts = contexts
            .iter()
            .filter(|(id, _)| m.contains(**id))
            .map(|(id, c)| (*id, c.clone()))
            .collect();
        m
    }

    /// The same, with `removed` (those of them that are no members, sorted) as the replicas
    /// changes removed.
    pub(crate) fn with_removed(mut self, removed: impl IntoIterator<Item = Addr>) -> Membership {
        let set: BTreeSet<Addr> = removed
            .into_iter()
            .filter(|&id| !self.contains(id))
            .collect();
        self.removed = set.into_iter().collect();
        self
    }

    /// Whether `id` is a member in any role.
    pub fn contains(&self, id: Addr) -> bool {
        self.voters.contains(&id) || self.outgoing.contains(&id) || self.learners.contains(&id)
    }

    /// Whether `id` votes (in either configuration while joint).
    pub fn votes(&self, id: Addr) -> bool {
        self.voters.contains(&id) || self.outgoing.contains(&id)
    }

    /// Whether the configuration has no member (a replica joining before it heard from the
    /// cluster).
    pub fn is_empty(&self) -> bool {
        self.voters.is_empty() && self.outgoing.is_empty() && self.learners.is_empty()
    }

    /// Whether the configuration is joint (a change of voters under way).
    pub fn is_joint(&self) -> bool {
        !self.outgoing.is_empty()
    }

    /// Every member, sorted, once.
    pub fn all(&self) -> Vec<Addr> {
        let set: BTreeSet<Addr> = self
            .voters
            .iter()
            .chain(&self.outgoing)
            .chain(&self.learners)
            .copied()
            .collect();
        set.into_iter().collect()
    }

    /// Whether `holders` are a quorum: a majority of the voters, and of the outgoing voters
    /// while joint. Learners never count.
    pub fn quorum(&self, holders: &BTreeSet<Addr>) -> bool {
        let majority_of = |voters: &[Addr]| {
            let held = voters.iter().filter(|v| holders.contains(v)).count();
            held > voters.len() / 2
        };
        !self.voters.is_empty()
            && majority_of(&self.voters)
            && (self.outgoing.is_empty() || majority_of(&self.outgoing))
    }
}

/// Whether raft-rs can take configuration `cs` as it stands (restoring it from a snapshot
/// aborts the process on one it cannot build, and quietly builds another from one whose roles
/// overlap): built as raft-rs restores one, it must come out the same.
pub(crate) fn well_formed(cs: &ConfState) -> bool {
    let single = |id: u64, kind: ConfChangeType| ConfChangeSingle {
        change_type: kind as i32,
        node_id: id,
    };
    let mut tracker = ProgressTracker::new(1);
    let mut apply = |changes: &[ConfChangeSingle], joint: Option<bool>| {
        let mut changer = Changer::new(&tracker);
        let made = match joint {
            None => changer.simple(changes),
            Some(auto_leave) => changer.enter_joint(auto_leave, changes),
        };
        match made {
            Ok((cfg, map)) => {
                tracker.apply_conf(cfg, map, 1);
                true
            }
            Err(_) => false,
        }
    };
    // As raft-rs restores one: the outgoing voters one by one, then the incoming
    // configuration entered jointly on top of them.
    let mut incoming = Vec::new();
    for &id in &cs.voters_outgoing {
        if !apply(&[single(id, ConfChangeType::AddNode)], None) {
            return false;
        }
        incoming.push(single(id, ConfChangeType::RemoveNode));
    }
    incoming.extend(
        cs.voters
            .iter()
            .map(|&id| single(id, ConfChangeType::AddNode)),
    );
    incoming.extend(
        cs.learners
            .iter()
            .chain(&cs.learners_next)
            .map(|&id| single(id, ConfChangeType::AddLearnerNode)),
    );
    let ok = if cs.voters_outgoing.is_empty() {
        incoming
            .iter()
            .all(|c| apply(std::slice::from_ref(c), None))
    } else {
        apply(&incoming, Some(cs.auto_leave))
    };
    ok && !cs.voters.is_empty() && same(&tracker.conf().to_conf_state(), cs)
}

/// Whether two configurations hold the same members in the same roles (raft-rs keeps no
/// order).
fn same(a: &ConfState, b: &ConfState) -> bool {
    let set = |ids: &[u64]| ids.iter().copied().collect::<BTreeSet<_>>();
    set(&a.voters) == set(&b.voters)
        && set(&a.voters_outgoing) == set(&b.voters_outgoing)
        && set(&a.learners) == set(&b.learners)
        && set(&a.learners_next) == set(&b.learners_next)
        && a.auto_leave == b.auto_leave
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(voters: &[u64], outgoing: &[u64], learners: &[u64]) -> ConfState {
        ConfState {
            voters: voters.to_vec(),
            voters_outgoing: outgoing.to_vec(),
            learners: learners.to_vec(),
            auto_leave: !outgoing.is_empty(),
            ..ConfState::default()
        }
    }

    #[test]
    fn a_quorum_is_a_majority_of_both_configurations_while_joint() {
        let m = Membership::of(&conf(&[1, 2, 4], &[1, 2, 3], &[5]), &BTreeMap::new());
        let set = |ids: &[u64]| ids.iter().copied().collect::<BTreeSet<_>>();
        assert!(m.quorum(&set(&[1, 2])));
        assert!(
            !m.quorum(&set(&[1, 4])),
            "not a majority of the outgoing voters"
        );
        assert!(!m.quorum(&set(&[3, 4, 5])), "a learner never counts");
        assert!(m.quorum(&set(&[2, 3, 4])));
        assert_eq!(m.all(), vec![1, 2, 3, 4, 5]);
        assert!(m.is_joint() && m.votes(3) && !m.votes(5) && m.contains(5));
        let single = Membership::of(&conf(&[7], &[], &[]), &BTreeMap::new());
        assert!(single.quorum(&set(&[7])));
        assert!(
            !Membership::default().quorum(&set(&[1])),
            "no voters, no quorum"
        );
    }

    #[test]
    fn contexts_are_kept_for_members_only() {
        let contexts = BTreeMap::from([(4, b"four".to_vec()), (9, b"gone".to_vec())]);
        let m = Membership::of(&conf(&[1, 2, 3], &[], &[4]), &contexts);
        assert_eq!(m.contexts, BTreeMap::from([(4, b"four".to_vec())]));
    }

    #[test]
    fn configurations_raft_cannot_take_are_told_apart() {
        assert!(well_formed(&conf(&[1, 2, 3], &[], &[])));
        assert!(well_formed(&conf(&[1, 2, 4], &[1, 2, 3], &[5])));
        assert!(!well_formed(&conf(&[], &[], &[])), "no voter");
        assert!(
            !well_formed(&conf(&[1, 2], &[], &[2])),
            "a voter that also learns"
        );
        let mut leaving = conf(&[1, 2], &[1, 2, 3], &[]);
        leaving.learners_next = vec![3];
        assert!(well_formed(&leaving), "an outgoing voter about to learn");
        leaving.learners_next = vec![4];
        assert!(
            !well_formed(&leaving),
            "about to learn, but not an outgoing voter"
        );
    }
}
