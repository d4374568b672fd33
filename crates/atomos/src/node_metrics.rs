//! What a node publishes to the metrics recorder once a second, whatever hosts it (the `node`
//! command's Prometheus endpoint, or an application's own recorder): transactions committed
//! and aborted by cause, per protocol. The order replica publishes its own figures from its
//! task (`ordering`), the disk its fsync latency (`disk`), the TCP transport its connections.

use std::sync::Weak;
use std::time::Duration;

use atomos_core::AbortCounts;
use atomos_net::rpc::Envelope;
use atomos_net::tcp::TcpTransport;
use atomos_net::transport::{NodeId, Transport};
use tokio_util::sync::CancellationToken;

use crate::node::Node;
use crate::wire::NodeMsg;

/// Aborted attempts by cause, as the `cause` label names them.
pub(crate) fn abort_causes(a: &AbortCounts) -> [(&'static str, u64); 7] {
    [
        ("read_locked", a.read_locked),
        ("read_validation", a.read_validation),
        ("lock_conflict", a.lock_conflict),
        ("commit_validation", a.commit_validation),
        ("abstract_lock", a.abstract_lock),
        ("explicit_retry", a.explicit_retry),
        ("upgrade", a.upgrade),
    ]
}

/// Publishes `node`'s transaction counters once a second until `stop`:
/// `atomos_tx_commits_total`, `atomos_tx_read_only_commits_total`,
/// `atomos_tx_aborts_total{cause}` and `atomos_tx_user_aborts_total`, labelled with the node
/// and its protocol.
pub(crate) async fn publish(id: NodeId, node: Node, stop: CancellationToken) {
    let mut timer = tokio::time::interval(Duration::from_secs(1));
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let (me, protocol) = (id.to_string(), node.protocol().to_string());
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = timer.tick() => {}
        }
        let s = node.stats();
        let labels = [("node", me.clone()), ("protocol", protocol.clone())];
        metrics::counter!("atomos_tx_commits_total", &labels).absolute(s.commits);
        metrics::counter!("atomos_tx_read_only_commits_total", &labels)
            .absolute(s.read_only_commits);
        metrics::counter!("atomos_tx_user_aborts_total", &labels).absolute(s.user_aborts);
        for (cause, n) in abort_causes(&s.aborts) {
            metrics::counter!(
                "atomos_tx_aborts_total",
                "node" => me.clone(),
                "protocol" => protocol.clone(),
                "cause" => cause
            )
            .absolute(n);
        }
    }
}

/// Publishes how many clients are connected to node `id` (`atomos_client_connections`) and
/// the wire version each open member link speaks (`atomos_link_wire_version{peer}`; a link
/// that stays down drops out after the recorder's idle time) once a second until `stop` or
/// until the transport is gone.
pub(crate) async fn publish_connections(
    id: NodeId,
    transport: Weak<TcpTransport<Envelope<NodeMsg>>>,
    stop: CancellationToken,
) {
    let mut timer = tokio::time::interval(Duration::from_secs(1));
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let gauge = metrics::gauge!("atomos_client_connections", "node" => id.to_string());
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = timer.tick() => {}
        }
        let Some(transport) = transport.upgrade() else {
            return;
        };
        gauge.set(transport.clients_connected() as f64);
        for peer in transport.peers() {
            if let Some(version) = transport.wire_version(peer) {
                metrics::gauge!(
                    "atomos_link_wire_version",
                    "node" => id.to_string(),
                    "peer" => peer.to_string()
                )
                .set(version as f64);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cause_is_named_once_and_the_causes_add_up() {
        let a = AbortCounts {
            read_locked: 1,
            read_validation: 2,
            lock_conflict: 3,
            commit_validation: 4,
            abstract_lock: 5,
            explicit_retry: 6,
            upgrade: 7,
        };
        let causes = abort_causes(&a);
        let names: std::collections::BTreeSet<_> = causes.iter().map(|(n, _)| *n).collect();
        assert_eq!(names.len(), causes.len());
        assert_eq!(causes.iter().map(|(_, n)| n).sum::<u64>(), a.total());
    }
}
