//! Where the members stand, asked by a client (`atomos status`, `atomos member list`), and the
//! members the cluster added through its log, learned from their answers: the client's
//! configuration file lists the members it was written with, the cluster's log the members it
//! has now.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use atomos_net::rpc::{Rpc, RpcError};
use atomos_net::transport::NodeId;
use tokio::time::{sleep, Instant};
use tokio_util::sync::CancellationToken;

use super::{Client, TICK};
use crate::status::{latest_view, MemberReport, ReplicaStatus};
use crate::wire::NodeMsg;

impl Client {
    /// The members this client knows: its configuration's, then those it learned the cluster
    /// added through its log (see [`Client::status`]), by id.
    pub fn members(&self) -> Vec<(NodeId, SocketAddr)> {
        let mut all = self.cfg.members.clone();
        for (&id, &address) in self.learned.read().iter() {
            if !all.iter().any(|&(m, _)| m == id) {
                all.push((id, address));
            }
        }
        all
    }

    /// Asks every member where it stands (at once, each for up to `wait`), and follows the
    /// membership the answers report: a member the cluster added through its log (with its
    /// address and keys) is learned, connected to and asked too, while `wait` lasts. Returns
    /// one report per member of the latest membership an answer reports (the one of the
    /// member that applied the most), in id order; when no answer reports one (a cluster
    /// without replicas, or none answered), one per member this client knows.
    pub async fn status(&self, wait: Duration) -> Vec<MemberReport> {
        let deadline = Instant::now() + wait;
        let mut reports: BTreeMap<NodeId, MemberReport> = BTreeMap::new();
        let mut asked: BTreeMap<NodeId, SocketAddr> = BTreeMap::new();
        let mut asks = tokio::task::JoinSet::new();
        loop {
            // Ask every member known and not asked yet: those of the configuration at first,
            // then those the answers so far report the cluster added; once an answer reports
            // the membership, only its members (a member the log removed is not waited for).
            let view = latest_view(reports.values()).map(ReplicaStatus::members);
            if let Some(ids) = &view {
                if ids.iter().all(|id| reports.contains_key(id)) {
                    break;
                }
            }
            for (member, address) in self.members() {
                if view.as_ref().is_some_and(|ids| !ids.contains(&member)) {
                    continue;
                }
                if asked.insert(member, address).is_none() {
                    let (rpc, stop) = (self.rpc.clone(), self.stop.clone());
                    let resend_after = self.cfg.resend_after;
                    asks.spawn(async move {
                        let answer = ask_until(&rpc, member, deadline, resend_after, &stop).await;
                        (member, address, answer)
                    });
                }
            }
            let Some(joined) = asks.join_next().await else {
                break;
            };
            let Ok((id, address, answer)) = joined else {
                continue;
            };
            let status = match answer {
                Ok(NodeMsg::StatusReport(s)) => Ok(*s),
                Ok(other) => Err(format!(
                    "answered a status request with {other:?}: is it an atomos node of this \
                     version?"
                )),
                Err(e) => Err(e),
            };
            reports.insert(
                id,
                MemberReport {
                    id,
                    address,
                    status,
                },
            );
            if let Some(view) = latest_view(reports.values()).cloned() {
                self.learn(&view);
            }
        }
        let ids: Vec<NodeId> = match latest_view(reports.values()) {
            Some(view) => view.members(),
            None => asked.keys().copied().collect(),
        };
        ids.into_iter()
            .map(|id| {
                reports.remove(&id).unwrap_or_else(|| MemberReport {
                    id,
                    address: SocketAddr::from(([0, 0, 0, 0], 0)),
                    status: Err("no address known: the cluster reports none for it".into()),
                })
            })
            .collect()
    }

    /// Learns the members `view` reports as added through the log that the configuration
    /// does not list (or that moved): admitted with their keys, dialled, and asked from now
    /// on. A member reported without a readable address or key is left out.
    fn learn(&self, view: &ReplicaStatus) {
        for (id, address, keys) in view.added_members() {
            let known = self.members().into_iter().any(|m| m == (id, address));
            if !known && self.transport.add_member(id, address, keys).is_ok() {
                self.learned.write().insert(id, address);
            }
        }
    }
}

/// Asks `member` for its status until it answers or `deadline` passes.
async fn ask_until(
    rpc: &Rpc<NodeMsg>,
    member: NodeId,
    deadline: Instant,
    resend_after: Duration,
    stop: &CancellationToken,
) -> Result<NodeMsg, String> {
    let mut last = String::from("no answer");
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(format!("{last} before the deadline"));
        }
        if stop.is_cancelled() {
            return Err("the client was closed".into());
        }
        match rpc
            .request(member, NodeMsg::Status, resend_after.min(deadline - now))
            .await
        {
            Ok(answer) => return Ok(answer),
            Err(RpcError::Timeout { .. }) => last = "no answer".into(),
            Err(e) => {
                last = format!("not reachable ({e})");
                sleep(TICK.min(deadline.saturating_duration_since(Instant::now()))).await;
            }
        }
    }
}
