//! Per-link counters, exported through the `metrics` facade (a Prometheus endpoint when the node
//! installs one; no-ops otherwise). Handles are registered once per link, so counting a message
//! is one atomic add.

use metrics::Counter;

use crate::transport::NodeId;

/// Messages and bytes on the link from one node to one peer.
pub(crate) struct LinkCounters {
    pub sent_messages: Counter,
    pub sent_bytes: Counter,
    pub received_messages: Counter,
    pub received_bytes: Counter,
}

impl LinkCounters {
    pub fn new(node: NodeId, peer: NodeId) -> LinkCounters {
        let labels = [("node", node.to_string()), ("peer", peer.to_string())];
        LinkCounters {
            sent_messages: metrics::counter!("atomos_messages_sent_total", &labels),
            sent_bytes: metrics::counter!("atomos_bytes_sent_total", &labels),
            received_messages: metrics::counter!("atomos_messages_received_total", &labels),
            received_bytes: metrics::counter!("atomos_bytes_received_total", &labels),
        }
    }
}

/// Counts a connection event (`up`, `down`, `refused`) on the link between `node` and `peer`
/// (`peer` is `None` when a refused connection never said who it was).
pub(crate) fn connection_event(node: NodeId, peer: Option<NodeId>, event: &'static str) {
    let peer = peer.map_or_else(|| "unknown".to_string(), |p| p.to_string());
    metrics::counter!(
        "atomos_connection_events_total",
        "node" => node.to_string(),
        "peer" => peer,
        "event" => event
    )
    .increment(1);
}
