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
    /// The counters of the link from `node` to member `peer`.
    pub fn new(node: NodeId, peer: NodeId) -> LinkCounters {
        LinkCounters::labelled(node, peer.to_string())
    }

    /// The counters all of `node`'s client links share (one label, whatever the clients).
    pub fn for_clients(node: NodeId) -> LinkCounters {
        LinkCounters::labelled(node, "clients".to_string())
    }

    fn labelled(node: NodeId, peer: String) -> LinkCounters {
        let labels = [("node", node.to_string()), ("peer", peer)];
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
/// Clients count under one label.
pub(crate) fn connection_event(node: NodeId, peer: Option<NodeId>, event: &'static str) {
    let peer = match peer {
        None => "unknown".to_string(),
        Some(p) if crate::transport::is_client(p) => "clients".to_string(),
        Some(p) => p.to_string(),
    };
    metrics::counter!(
        "atomos_connection_events_total",
        "node" => node.to_string(),
        "peer" => peer,
        "event" => event
    )
    .increment(1);
}
