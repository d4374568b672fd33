//! Membership changes from an operator's client: asked of the leader, wherever it is.

use std::time::Duration;

use atomos_net::rpc::RpcError;
use tokio::time::{sleep, Instant};

use super::{Client, TICK};
use crate::wire::{MemberRefusal, MemberRequest, NodeMsg};

impl Client {
    /// Asks the cluster to make `request` (the client must be one the members list in
    /// `operators`): sent to the members in turn (a member that does not lead passes it on to
    /// the leader), and to the leader a member names (learned from the members' status when
    /// the cluster added it through its log), until one proposes it or `wait` has passed. An
    /// answer lost on the way makes the next attempt find the change under way or made, and
    /// say so. Returns the log position it was proposed at (it has taken effect once `status`
    /// shows it; a leader change can drop a proposal: ask again).
    /// A refusal other than "not the leader" (not an operator, a change under way, a learner
    /// not caught up, a change that does not fit) comes back at once.
    pub async fn change_membership(
        &self,
        request: MemberRequest,
        wait: Duration,
    ) -> Result<u64, MemberRefusal> {
        let deadline = Instant::now() + wait;
        let ids = |client: &Client| -> Vec<u64> { client.members().iter().map(|m| m.0).collect() };
        let mut members = ids(self);
        if members.is_empty() {
            return Err(MemberRefusal::Refused("the client knows no member".into()));
        }
        let mut next = 0;
        let mut hint: Option<u64> = None;
        let mut last = String::from("no member answered");
        while Instant::now() < deadline && !self.stop.is_cancelled() {
            if hint.is_some_and(|l| !members.contains(&l)) {
                // A leader the cluster added through its log: learn where it listens.
                let pause = deadline.saturating_duration_since(Instant::now());
                self.status(self.cfg.resend_after.min(pause)).await;
                members = ids(self);
            }
            let to = match hint.take().filter(|l| members.contains(l)) {
                Some(leader) => leader,
                None => {
                    if next > 0 && next % members.len() == 0 {
                        // Every member was asked: give an election time to end.
                        let pause = deadline.saturating_duration_since(Instant::now());
                        sleep((TICK * 10).min(pause)).await;
                    }
                    next += 1;
                    members[(next - 1) % members.len()]
                }
            };
            let limit = self
                .cfg
                .resend_after
                .min(deadline.saturating_duration_since(Instant::now()));
            let msg = NodeMsg::ChangeMembership(request.clone());
            match self.rpc.request(to, msg, limit).await {
                Ok(NodeMsg::MembershipChanged(Ok(at))) => return Ok(at),
                Ok(NodeMsg::MembershipChanged(Err(MemberRefusal::NotLeader { leader }))) => {
                    last = format!("member {to} does not lead");
                    hint = leader.filter(|&l| l != to);
                }
                Ok(NodeMsg::MembershipChanged(Err(refusal))) => return Err(refusal),
                Ok(other) => {
                    last = format!(
                        "member {to} answered a membership change with {other:?}: is it an \
                         atomos node of this version?"
                    )
                }
                Err(RpcError::Timeout { .. }) => last = format!("member {to} did not answer"),
                Err(e) => last = format!("member {to} is not reachable ({e})"),
            }
        }
        Err(MemberRefusal::Refused(format!(
            "no member proposed the change within {wait:?} ({last})"
        )))
    }
}
