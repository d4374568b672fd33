//! The operator of the membership runs: a script of changes the leader is asked for, one at a
//! time, each once it is due and the ones before it show in the membership. The order layer's
//! simulation and the replicated protocols' (`protocols/tests/certify_sim.rs`) both run it.

use atomos_order::{MemberChange, Membership, Replica, StateMachine};

/// The operator's script in membership runs, in order, each step with the earliest time it is
/// asked for: grow from 3 to 4 voters, add a fifth as learner and swap it for replica 1 (a
/// joint configuration), then remove replica 2. The cluster ends with voters 3, 4 and 5.
pub fn operator_script() -> [(u64, MemberChange); 5] {
    let add = |id| MemberChange::AddLearner {
        id,
        context: format!("replica {id}").into_bytes(),
    };
    [
        (400, add(4)),
        (1_000, MemberChange::Promote { id: 4 }),
        (1_600, add(5)),
        (2_200, MemberChange::Replace { remove: 1, add: 5 }),
        (2_800, MemberChange::Remove { id: 2 }),
    ]
}

/// Whether a step of the script shows in `m`.
fn done(step: &MemberChange, m: &Membership) -> bool {
    match step {
        MemberChange::AddLearner { id, .. } => m.contains(*id),
        MemberChange::Promote { id } => m.votes(*id),
        MemberChange::Replace { remove, add } => m.votes(*add) && !m.contains(*remove),
        MemberChange::Remove { id } => !m.contains(*id),
    }
}

/// The first step of the script that `m` does not show yet, if it is due at `now`.
pub fn next_change(now: u64, m: &Membership) -> Option<MemberChange> {
    let (at, step) = operator_script()
        .into_iter()
        .find(|(_, step)| !done(step, m))?;
    (now >= at).then_some(step)
}

/// The membership a run ends with when the script ran to the end.
pub fn scripted_end() -> Membership {
    Membership {
        voters: vec![3, 4, 5],
        contexts: [4, 5]
            .into_iter()
            .map(|id| (id, format!("replica {id}").into_bytes()))
            .collect(),
        removed: vec![1, 2],
        ..Membership::default()
    }
}

/// The membership a run ends with: of the memberships `delivered` (entry seq, membership), the
/// one at the highest position; the founding one (`founders` voters) if none changed.
pub fn last_membership<'a>(
    delivered: impl Iterator<Item = (u64, &'a Membership)>,
    founders: u64,
) -> Membership {
    delivered.max_by_key(|(seq, _)| *seq).map_or_else(
        || Membership {
            voters: (1..=founders).collect(),
            ..Membership::default()
        },
        |(_, m)| m.clone(),
    )
}

/// Whether `replica` knows it was removed: it had a configuration, and it is not in it.
pub fn removed<S: StateMachine>(replica: &Replica<S>) -> bool {
    let m = replica.membership();
    !m.is_empty() && !m.contains(replica.id())
}
