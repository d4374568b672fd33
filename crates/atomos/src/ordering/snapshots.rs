//! Snapshots as the order node hands them out: the replica's latest, with its state, once it
//! covers a position (what a backup takes).

use tokio::sync::{mpsc, oneshot};

use super::requests::Event;

/// Asks an order node's replica for a snapshot with its state (see
/// [`OrderNode::snapshotter`](super::OrderNode::snapshotter)).
#[derive(Clone, Debug)]
pub struct Snapshotter {
    tx: mpsc::UnboundedSender<Event>,
}

impl Snapshotter {
    pub(super) fn new(tx: mpsc::UnboundedSender<Event>) -> Snapshotter {
        Snapshotter { tx }
    }

    /// The replica's latest snapshot once it covers position `after` (the replica takes one
    /// as soon as it has delivered that far, however short its log since the last), or
    /// `None` if the order node stops first.
    pub async fn covering(&self, after: u64) -> Option<atomos_order::SnapshotCopy> {
        let (reply, answer) = oneshot::channel();
        self.tx.send(Event::Snapshot { after, reply }).ok()?;
        answer.await.ok()
    }
}
