//! What a member says of itself when an operator asks (`atomos status`,
//! [`Client::status`](crate::Client::status)): its protocol, its health and readiness, and on
//! a replica where its log stands.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::net::keys::PublicKey;
use crate::net::transport::NodeId;

/// What one member answered to [`Client::status`](crate::Client::status).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemberReport {
    /// The member's id.
    pub id: NodeId,
    /// Its address, as the client's configuration lists it or the cluster reported it
    /// (`0.0.0.0:0` when none is known).
    pub address: SocketAddr,
    /// Its account of itself, or why there is none (unreachable, no answer in time).
    pub status: Result<MemberStatus, String>,
}

/// A member's account of itself, as of when it answered.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberStatus {
    /// Its id.
    pub id: NodeId,
    /// The protocol it runs (`local`, `tfa`, `certify`, `active`, `oss`).
    pub protocol: String,
    /// Its first component failure, if one failed (it then stops: restart it).
    pub failure: Option<String>,
    /// Why it is not ready to serve (`None`: ready). The same answer as its `/ready` endpoint.
    pub not_ready: Option<String>,
    /// Its order-layer replica, under the replicated protocols (`None` under `local` and
    /// `tfa`, or before its replica started).
    pub replica: Option<ReplicaStatus>,
}

/// Where a replica's log stands.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaStatus {
    /// The leader it follows, or itself if it leads (`None`: none known, an election runs or
    /// no majority is reachable).
    pub leader: Option<NodeId>,
    /// Its Raft term.
    pub term: u64,
    /// The highest log position it knows committed (a follower knows no commit past its own
    /// log).
    pub commit: u64,
    /// The last position it applied (finally delivered).
    pub applied: u64,
    /// It rebuilds a lost log from the others (it does not vote meanwhile).
    pub rebuilding: bool,
    /// Messages its transport refused to send for it.
    pub sends_refused: u64,
    /// The latest refusal an operator must act on (a message too large for a frame).
    pub last_refused: Option<String>,
    /// Why the replica is not ready (`None`: ready).
    pub not_ready: Option<String>,
    /// The voters of the membership it applied last (of the incoming configuration while a
    /// change of voters is under way); empty while a joining replica waits for its first
    /// snapshot.
    pub voters: Vec<NodeId>,
    /// The learners of that membership.
    pub learners: Vec<NodeId>,
    /// The outgoing voters while a change of voters is under way (empty otherwise).
    pub outgoing: Vec<NodeId>,
    /// Where the members added through the log listen, by id (the founders are in the
    /// configuration files).
    pub addresses: Vec<(NodeId, String)>,
    /// The public keys of the members added through the log, by id: with `addresses`, what a
    /// client needs to reach a member its configuration file does not list.
    pub public_keys: Vec<(NodeId, Vec<String>)>,
}

impl ReplicaStatus {
    /// Whether it knows a membership (a joining replica knows none before its first
    /// snapshot).
    pub fn knows_members(&self) -> bool {
        !(self.voters.is_empty() && self.learners.is_empty() && self.outgoing.is_empty())
    }

    /// The members added through the log with where they listen and the keys they prove,
    /// as [`ReplicaStatus::addresses`] and [`ReplicaStatus::public_keys`] report them; one
    /// reported without a readable address or key is left out.
    pub fn added_members(&self) -> Vec<(NodeId, SocketAddr, Vec<PublicKey>)> {
        let keys: std::collections::BTreeMap<NodeId, &Vec<String>> =
            self.public_keys.iter().map(|(id, k)| (*id, k)).collect();
        self.addresses
            .iter()
            .filter_map(|(id, address)| {
                let address = address.parse().ok()?;
                let keys = keys.get(id)?.iter().map(|k| k.parse().ok());
                let keys: Vec<PublicKey> = keys.collect::<Option<_>>()?;
                (!keys.is_empty()).then_some((*id, address, keys))
            })
            .collect()
    }

    /// Every member of the membership it applied last (voters, outgoing voters, learners), in
    /// id order.
    pub fn members(&self) -> Vec<NodeId> {
        let all = self
            .voters
            .iter()
            .chain(&self.outgoing)
            .chain(&self.learners);
        let set: std::collections::BTreeSet<NodeId> = all.copied().collect();
        set.into_iter().collect()
    }

    /// Whether `id` votes in the membership it applied last.
    pub fn votes(&self, id: NodeId) -> bool {
        self.voters.contains(&id) || self.outgoing.contains(&id)
    }
}

/// The replica status of the member that applied the most of the log among those that know a
/// membership (a joining replica knows none before its first snapshot): the cluster's
/// membership as the most up-to-date answer has it.
pub fn latest_view<'a>(
    reports: impl IntoIterator<Item = &'a MemberReport>,
) -> Option<&'a ReplicaStatus> {
    reports
        .into_iter()
        .filter_map(|r| r.status.as_ref().ok()?.replica.as_ref())
        .filter(|s| s.knows_members())
        .max_by_key(|s| s.applied)
}

/// Whether members of `protocol` have no replica (`local`, `tfa`).
fn unreplicated(protocol: &str) -> bool {
    matches!(protocol, "local" | "tfa")
}

impl MemberStatus {
    /// Its role: `leader`, `follower` (a voter that follows), `learner` (it receives the log
    /// and votes on nothing), `removed` (the membership it applied leaves it out), `no leader`
    /// (a replica that knows none), `not replicated` (no replica: `local`, `tfa`), or
    /// `unknown` (a replicated protocol
    /// whose replica reports nothing: not started yet, or `oss`, whose control log does not
    /// report its state yet).
    pub fn role(&self) -> &'static str {
        match &self.replica {
            None if unreplicated(&self.protocol) => "not replicated",
            None => "unknown",
            Some(r) if r.knows_members() && r.learners.contains(&self.id) => "learner",
            Some(r) if r.knows_members() && !r.votes(self.id) => "removed",
            Some(r) => match r.leader {
                Some(l) if l == self.id => "leader",
                Some(_) => "follower",
                None => "no leader",
            },
        }
    }
}

/// What the members' reports say of the cluster as a whole.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClusterSummary {
    /// Members reported on (those of the latest membership an answer reports, or every member
    /// asked).
    pub members: usize,
    /// Members that answered.
    pub answered: usize,
    /// The (leader, term) most answering voters follow (on a tie, the higher term).
    pub leader: Option<(NodeId, u64)>,
    /// Voters (the leader included) that follow that leader in that term.
    pub with_leader: usize,
    /// Whether the cluster can commit now: a majority of the voters (of both sets while a
    /// change of voters is under way) follow one leader in one term (always true of a cluster
    /// without replicas whose members all answered). Without any membership reported, every
    /// member counts as a voter.
    pub can_commit: bool,
    /// The highest commit position any member reports (what lag is counted from).
    pub highest_commit: u64,
    /// One line saying why the cluster can or cannot commit.
    pub verdict: String,
}

impl ClusterSummary {
    /// The summary of `reports` (one per member).
    pub fn of(reports: &[MemberReport]) -> ClusterSummary {
        let answered: Vec<&MemberStatus> = reports
            .iter()
            .filter_map(|r| r.status.as_ref().ok())
            .collect();
        let members = reports.len();
        let replicas: Vec<(NodeId, &ReplicaStatus)> = answered
            .iter()
            .filter_map(|s| s.replica.as_ref().map(|r| (s.id, r)))
            .collect();
        let highest_commit = replicas.iter().map(|(_, r)| r.commit).max().unwrap_or(0);
        // Who votes: the membership the member that applied the most reports (both sets while
        // a change of voters is under way), or every member asked when none reports one.
        let view = latest_view(reports.iter());
        let votes = |id: NodeId| view.is_none_or(|v| v.votes(id));
        // The (leader, term) most voters follow: a leader that does not answer still leads if
        // a majority follows it; one the membership no longer counts as a voter (it removed
        // itself, and its followers have not noticed yet) does not.
        let mut followed: std::collections::BTreeMap<(NodeId, u64), usize> = Default::default();
        for (id, r) in &replicas {
            if let Some(l) = r.leader.filter(|&l| votes(*id) && votes(l)) {
                *followed.entry((l, r.term)).or_default() += 1;
            }
        }
        let leader = followed
            .iter()
            .max_by_key(|&(&(l, term), &n)| (n, term, l))
            .map(|(&pair, _)| pair);
        let with_leader = leader.map_or(0, |pair| followed[&pair]);
        let follows = |ids: &[NodeId]| {
            replicas
                .iter()
                .filter(|(id, r)| ids.contains(id) && leader == r.leader.map(|l| (l, r.term)))
                .count()
        };
        let (voting, majority, quorate) = match &view {
            Some(v) => {
                let incoming = follows(&v.voters) > v.voters.len() / 2;
                let outgoing = v.outgoing.is_empty() || follows(&v.outgoing) > v.outgoing.len() / 2;
                let voting = v.members().into_iter().filter(|&id| v.votes(id)).count();
                let majority = match v.outgoing.is_empty() {
                    true => format!("{}", v.voters.len() / 2 + 1),
                    false => format!(
                        "{} of the incoming and {} of the outgoing",
                        v.voters.len() / 2 + 1,
                        v.outgoing.len() / 2 + 1
                    ),
                };
                (voting, majority, incoming && outgoing)
            }
            None => (
                members,
                format!("{}", members / 2 + 1),
                with_leader > members / 2,
            ),
        };
        let (can_commit, verdict) = if answered.is_empty() {
            (false, "no member answered".to_string())
        } else if answered.iter().all(|s| unreplicated(&s.protocol)) {
            let protocol = &answered[0].protocol;
            (
                answered.len() == members,
                format!(
                    "not replicated ({protocol}): {} of {members} members answered",
                    answered.len()
                ),
            )
        } else if replicas.is_empty() {
            (
                false,
                format!(
                    "cannot tell: no answering member reports a replica ({}: {})",
                    answered[0].protocol,
                    if answered[0].protocol == "oss" {
                        "its control log does not report its state yet"
                    } else {
                        "its replica has not started"
                    }
                ),
            )
        } else {
            match leader {
                Some((l, term)) if quorate => (
                    true,
                    format!(
                        "can commit: leader {l} in term {term}, followed by {with_leader} of the \
                         {voting} voters"
                    ),
                ),
                Some((l, term)) => (
                    false,
                    format!(
                        "cannot commit: leader {l} in term {term} is followed by {with_leader} \
                         of the {voting} voters, fewer than a majority ({majority})"
                    ),
                ),
                None => (
                    false,
                    format!(
                        "cannot commit: no answering member knows a leader ({} of {members} \
                         answered)",
                        answered.len()
                    ),
                ),
            }
        };
        ClusterSummary {
            members,
            answered: answered.len(),
            leader,
            with_leader,
            can_commit,
            highest_commit,
            verdict,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(id: NodeId, leader: Option<NodeId>, term: u64, commit: u64) -> MemberReport {
        MemberReport {
            id,
            address: SocketAddr::from(([127, 0, 0, 1], 7400 + id as u16)),
            status: Ok(MemberStatus {
                id,
                protocol: "certify".into(),
                replica: Some(ReplicaStatus {
                    leader,
                    term,
                    commit,
                    applied: commit,
                    ..ReplicaStatus::default()
                }),
                ..MemberStatus::default()
            }),
        }
    }

    fn gone(id: NodeId) -> MemberReport {
        MemberReport {
            status: Err("no answer".into()),
            ..replica(id, None, 0, 0)
        }
    }

    /// `id` reporting the membership `voters` and `learners`, following leader 1 in term 2
    /// (or no one).
    fn member_of(
        id: NodeId,
        follows: bool,
        voters: &[NodeId],
        learners: &[NodeId],
    ) -> MemberReport {
        let mut r = replica(id, follows.then_some(1), 2, 20);
        if let Ok(MemberStatus {
            replica: Some(s), ..
        }) = &mut r.status
        {
            s.voters = voters.to_vec();
            s.learners = learners.to_vec();
        }
        r
    }

    #[test]
    fn only_voters_count_towards_the_majority() {
        let (voters, learners) = ([1, 2, 3], [4, 5]);
        // The leader and two learners follow: three of five members, one of three voters.
        let s = ClusterSummary::of(&[
            member_of(1, true, &voters, &learners),
            member_of(2, false, &voters, &learners),
            member_of(3, false, &voters, &learners),
            member_of(4, true, &voters, &learners),
            member_of(5, true, &voters, &learners),
        ]);
        assert!(!s.can_commit, "{}", s.verdict);
        assert!(s.verdict.contains("1 of the 3 voters"), "{}", s.verdict);
        // A leader the membership no longer lists leads no one, however many still follow it.
        let s = ClusterSummary::of(&[
            member_of(1, true, &[2, 3, 4], &[]),
            member_of(2, true, &[2, 3, 4], &[]),
            member_of(3, true, &[2, 3, 4], &[]),
        ]);
        assert!(!s.can_commit, "{}", s.verdict);
        // Two voters follow: a majority of the voters, learners or not.
        let s = ClusterSummary::of(&[
            member_of(1, true, &voters, &learners),
            member_of(2, true, &voters, &learners),
            member_of(3, false, &voters, &learners),
            member_of(4, false, &voters, &learners),
            member_of(5, false, &voters, &learners),
        ]);
        assert!(s.can_commit, "{}", s.verdict);
    }

    #[test]
    fn a_majority_following_one_leader_can_commit_and_fewer_cannot() {
        let all = [
            replica(1, Some(2), 3, 10),
            replica(2, Some(2), 3, 12),
            replica(3, Some(2), 3, 11),
        ];
        let s = ClusterSummary::of(&all);
        assert!(s.can_commit, "{}", s.verdict);
        assert_eq!(
            (s.leader, s.with_leader, s.highest_commit),
            (Some((2, 3)), 3, 12)
        );
        assert_eq!(all[1].status.as_ref().unwrap().role(), "leader");
        assert_eq!(all[0].status.as_ref().unwrap().role(), "follower");

        // The leader alone (its followers unreachable) cannot commit.
        let s = ClusterSummary::of(&[gone(1), replica(2, Some(2), 3, 12), gone(3)]);
        assert!(
            !s.can_commit && s.verdict.contains("fewer than a majority"),
            "{}",
            s.verdict
        );

        // A deposed leader still claiming an old term counts for nothing.
        let s = ClusterSummary::of(&[
            replica(1, Some(1), 2, 9),
            replica(2, Some(3), 4, 12),
            replica(3, Some(3), 4, 12),
        ]);
        assert_eq!(
            (s.leader, s.with_leader, s.can_commit),
            (Some((3, 4)), 2, true)
        );

        let s = ClusterSummary::of(&[gone(1), gone(2), gone(3)]);
        assert!(!s.can_commit && s.verdict == "no member answered");
        let s = ClusterSummary::of(&[replica(1, None, 5, 0), replica(2, None, 5, 0)]);
        assert!(!s.can_commit && s.verdict.contains("no answering member knows a leader"));
        // The leader does not answer, but the two others follow it: a majority.
        let s = ClusterSummary::of(&[
            replica(1, Some(2), 3, 10),
            gone(2),
            replica(3, Some(2), 3, 10),
        ]);
        assert_eq!(
            (s.leader, s.with_leader, s.can_commit),
            (Some((2, 3)), 2, true)
        );
    }

    #[test]
    fn members_without_replicas_are_summed_up_as_such() {
        let plain = |id| MemberReport {
            status: Ok(MemberStatus {
                id,
                protocol: "tfa".into(),
                ..MemberStatus::default()
            }),
            ..gone(id)
        };
        let s = ClusterSummary::of(&[plain(1), plain(2)]);
        assert!(s.can_commit && s.verdict.starts_with("not replicated (tfa)"));
        assert_eq!(plain(1).status.unwrap().role(), "not replicated");
        let s = ClusterSummary::of(&[plain(1), gone(2)]);
        assert!(!s.can_commit, "{}", s.verdict);
        // A replicated protocol whose members report no replica: nothing can be told.
        let silent = |id| MemberReport {
            status: Ok(MemberStatus {
                id,
                protocol: "oss".into(),
                ..MemberStatus::default()
            }),
            ..gone(id)
        };
        let s = ClusterSummary::of(&[silent(1), silent(2)]);
        assert!(
            !s.can_commit && s.verdict.starts_with("cannot tell"),
            "{}",
            s.verdict
        );
        assert_eq!(silent(1).status.unwrap().role(), "unknown");
    }
}
