//! What one domain's token is on a node in the current epoch: held (with the nodes waiting for
//! it), passed and not yet acknowledged, or awaited; where it probably is.

use std::collections::VecDeque;

use super::msg::Token;
use super::write_set::CommitId;

/// A token this node holds.
#[derive(Debug)]
pub(super) struct HeldToken {
    pub(super) hop: u64,
    pub(super) next: CommitId,
    /// Nodes waiting for it, in order.
    pub(super) requests: VecDeque<u64>,
    /// The write that logs taking it: neither used, passed nor acknowledged before it is
    /// durable (a node that crashed before would take it again).
    pub(super) write: u64,
    /// The node that passed it, acknowledged once the write is durable.
    pub(super) ack_to: Option<u64>,
}

/// A token passed and not acknowledged yet: sent again until it is.
#[derive(Debug)]
pub(super) struct PassedToken {
    pub(super) to: u64,
    pub(super) token: Token,
    pub(super) at: u64,
}

/// One domain's token on this node, in the current epoch.
#[derive(Debug, Default)]
pub(super) struct TokenState {
    pub(super) held: Option<HeldToken>,
    /// The highest hop taken or passed here in this epoch.
    pub(super) taken: Option<u64>,
    pub(super) passed: Option<PassedToken>,
    /// Where the token probably is (owner prediction): where it went last, or the node that
    /// numbered the latest write set seen.
    pub(super) hint: u64,
    /// Requests kept to put in the token when it arrives: by the coordinator, or by a node
    /// itself waiting for the token.
    pub(super) buffered: VecDeque<u64>,
    /// When this node last asked for the token (`None`: it does not wait for it).
    pub(super) requested_at: Option<u64>,
    /// Requests asked of it so far in this wait (the first goes to the predicted holder, the
    /// next ones to every node).
    pub(super) asked: u32,
}

impl TokenState {
    /// A fresh state for an epoch whose start named `named`.
    pub(super) fn new(named: u64) -> TokenState {
        TokenState {
            hint: named,
            ..TokenState::default()
        }
    }

    /// Adds `node` to `list` unless it is there already.
    pub(super) fn add_request(list: &mut VecDeque<u64>, node: u64) {
        if !list.contains(&node) {
            list.push_back(node);
        }
    }
}
