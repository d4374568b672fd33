//! Membership changes as the order node offers them: who hears of each membership the replica
//! applies, the handle that asks for changes, and why a change was not made.

use std::sync::Arc;

use atomos_order::{ChangeRefused, MemberChange, Membership};
use tokio::sync::{mpsc, oneshot};

use super::requests::Event;

/// What hears of a membership the replica applied: called with the one it replaced (`None`
/// at start) and the new one.
pub type MembershipFn = dyn Fn(Option<&Membership>, &Membership) + Send + Sync;

/// Hears of a membership the replica applied, with the one it replaced (`None` at start).
#[derive(Clone)]
pub struct MembershipHook(pub Arc<MembershipFn>);

impl std::fmt::Debug for MembershipHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MembershipHook")
    }
}

/// Asks an order node's replica for membership changes (see [`OrderNode::changer`](super::OrderNode::changer)).
#[derive(Clone, Debug)]
pub struct MemberChanger {
    tx: mpsc::UnboundedSender<Event>,
}

impl MemberChanger {
    pub(super) fn new(tx: mpsc::UnboundedSender<Event>) -> MemberChanger {
        MemberChanger { tx }
    }

    /// See [`OrderNode::change_membership`](super::OrderNode::change_membership).
    pub async fn change(&self, change: MemberChange) -> Result<u64, MembershipError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Event::ChangeMembership { change, reply })
            .map_err(|_| MembershipError::Stopped)?;
        Ok(answer.await.map_err(|_| MembershipError::Stopped)??)
    }
}

/// Why a membership change was not made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MembershipError {
    /// The leader refused it (or this replica does not lead).
    #[error(transparent)]
    Refused(#[from] ChangeRefused),
    /// The order node stopped before it answered.
    #[error("the order node stopped")]
    Stopped,
    /// The node runs no order replica (its protocol does not change members).
    #[error("this node runs {0}: only certify and active clusters change their members")]
    NotReplicated(String),
}
