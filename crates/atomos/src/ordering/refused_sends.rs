//! Messages the transport refused to send for the replica: counted, kept for the node's
//! stats, and reported in the log, never dropped in silence. A message too large for a frame
//! (a snapshot past `max_frame_bytes`, which a lagging replica then never receives) is
//! reported at warning level, at most once a minute per peer; a full backlog or an unknown peer
//! passes (the replica sends again) and is only counted.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use atomos_net::transport::SendError;
use atomos_order::{Addr, OrderMsg};
use parking_lot::Mutex;

/// How often one peer's refused oversized messages are reported in the log.
const REPORT_EVERY: Duration = Duration::from_secs(60);

/// The refused sends of one order node, shared with its stats.
#[derive(Default)]
pub(super) struct RefusedSends {
    count: AtomicU64,
    /// The latest refusal that will not pass by itself (a message that cannot be encoded).
    last: Mutex<Option<String>>,
}

impl RefusedSends {
    /// Sends refused so far.
    pub(super) fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The latest refusal that needs an operator (an oversized or unencodable message).
    pub(super) fn last(&self) -> Option<String> {
        self.last.lock().clone()
    }
}

/// When each peer's refusals were last reported in the log (the order task's own).
#[derive(Default)]
pub(super) struct Reported(BTreeMap<Addr, Instant>);

impl RefusedSends {
    /// The transport refused `msg` (described by `what`, `bytes` long) for `to` with `error`.
    pub(super) fn refused(
        &self,
        reported: &mut Reported,
        to: Addr,
        Described { what, size, unit }: Described,
        error: &SendError,
    ) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let reason = match error {
            SendError::Encode { .. } => "encode",
            SendError::Backlog { .. } => "backlog",
            SendError::UnknownPeer(_) => "unknown_peer",
            _ => "closed",
        };
        metrics::counter!("atomos_order_sends_refused_total", "reason" => reason).increment(1);
        let SendError::Encode { reason, .. } = error else {
            return;
        };
        let text = format!(
            "a {what} of {size} {unit} for node {to} was not sent: {reason} (a message past \
             `max_frame_bytes`: raise it, up to 1 GiB, on every node, or make the requests \
             smaller)"
        );
        *self.last.lock() = Some(text.clone());
        let now = Instant::now();
        let due = reported
            .0
            .get(&to)
            .is_none_or(|at| now.duration_since(*at) >= REPORT_EVERY);
        if due {
            // Peers (clients among them) not reported for a while are forgotten.
            reported
                .0
                .retain(|_, at| now.duration_since(*at) < REPORT_EVERY);
            reported.0.insert(to, now);
            tracing::warn!(peer = to, size, "{text}");
        }
    }
}

/// What an order-layer message is and how big, in a unit that costs nothing to count (it is
/// taken before every send, since the transport consumes the message).
pub(super) fn describe(msg: &OrderMsg) -> Described {
    let (what, size, unit) = match msg {
        OrderMsg::Raft(bytes) => ("Raft message", bytes.len(), "bytes"),
        OrderMsg::State { snapshot } => ("snapshot", snapshot.len(), "bytes"),
        OrderMsg::StreamChunk { data, .. } => ("snapshot chunk", data.len(), "bytes"),
        OrderMsg::Batch { requests, .. } => ("batch", requests.len(), "requests"),
        OrderMsg::Request(r) => ("request", r.payload.len(), "bytes of payload"),
        _ => ("message", 0, "bytes"),
    };
    Described { what, size, unit }
}

/// A message as a report names it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Described {
    what: &'static str,
    size: usize,
    unit: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oversized_message_is_kept_and_reported_a_backlog_only_counted() {
        let refused = RefusedSends::default();
        let mut reported = Reported::default();
        let backlog = SendError::Backlog {
            peer: 2,
            queued: 10,
            limit: 5,
        };
        let batch = describe(&OrderMsg::Batch {
            id: atomos_order::BatchId { origin: 1, n: 1 },
            requests: Vec::new(),
        });
        refused.refused(&mut reported, 2, batch, &backlog);
        assert_eq!((refused.count(), refused.last()), (1, None));
        let too_large = SendError::Encode {
            peer: 3,
            reason: "frame of 20000000 bytes is over the limit".into(),
        };
        let snapshot = describe(&OrderMsg::State {
            snapshot: vec![0; 100],
        });
        refused.refused(&mut reported, 3, snapshot, &too_large);
        refused.refused(&mut reported, 3, snapshot, &too_large);
        assert_eq!(refused.count(), 3);
        let last = refused.last().expect("kept");
        assert!(
            last.contains("snapshot of 100 bytes for node 3") && last.contains("max_frame_bytes"),
            "{last}"
        );
        assert_eq!(reported.0.len(), 1, "reported once for the peer");
    }
}
