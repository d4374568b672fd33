//! The in-memory transport, for clusters inside one process: messages are handed to the
//! receiver directly (no encoding), with the same fault rules as TCP.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::transport::{Deliver, FaultRules, NodeId, SendError, Transport, Verdict};

/// The medium several in-memory nodes share.
pub struct MemoryNetwork<M> {
    members: RwLock<HashMap<NodeId, Member<M>>>,
}

struct Member<M> {
    deliver: Arc<dyn Deliver<M>>,
    faults: Arc<FaultRules>,
}

impl<M> Clone for Member<M> {
    fn clone(&self) -> Self {
        Member {
            deliver: self.deliver.clone(),
            faults: self.faults.clone(),
        }
    }
}

impl<M: Send + 'static> MemoryNetwork<M> {
    /// An empty network.
    pub fn new() -> Arc<MemoryNetwork<M>> {
        Arc::new(MemoryNetwork {
            members: RwLock::new(HashMap::new()),
        })
    }

    /// Adds node `id`, whose messages go to `deliver`. Every member already present sees the
    /// link to it come up, and it sees theirs. A second join with the same id replaces the first
    /// (a restart).
    pub fn join(
        self: &Arc<Self>,
        id: NodeId,
        deliver: Arc<dyn Deliver<M>>,
    ) -> Arc<MemoryTransport<M>> {
        let faults = Arc::new(FaultRules::default());
        let others: Vec<(NodeId, Arc<dyn Deliver<M>>)> = {
            let mut members = self.members.write();
            let me = Member {
                deliver: deliver.clone(),
                faults: faults.clone(),
            };
            members.insert(id, me);
            members
                .iter()
                .filter(|(&n, _)| n != id)
                .map(|(&n, m)| (n, m.deliver.clone()))
                .collect()
        };
        for (peer, other) in others {
            other.link(id, true);
            deliver.link(peer, true);
        }
        Arc::new(MemoryTransport {
            id,
            runtime: tokio::runtime::Handle::try_current().ok(),
            network: self.clone(),
            faults,
        })
    }

    /// Removes `id`, unless it has re-joined since (`faults` tells the incarnations apart).
    fn leave(&self, id: NodeId, faults: &Arc<FaultRules>) {
        let others: Vec<Arc<dyn Deliver<M>>> = {
            let mut members = self.members.write();
            if !members
                .get(&id)
                .is_some_and(|m| Arc::ptr_eq(&m.faults, faults))
            {
                return;
            }
            members.remove(&id);
            members.values().map(|m| m.deliver.clone()).collect()
        };
        for other in others {
            other.link(id, false);
        }
    }
}

/// One node's end of a [`MemoryNetwork`]. Delays need a tokio runtime (the message is handed
/// over by a timer task): the sender's, or else the one the node joined from (so threads
/// outside any runtime, such as a protocol stepped by an application thread, send delayed
/// messages too); everything else works on any thread.
pub struct MemoryTransport<M> {
    id: NodeId,
    network: Arc<MemoryNetwork<M>>,
    faults: Arc<FaultRules>,
    runtime: Option<tokio::runtime::Handle>,
}

impl<M: Send + 'static> Transport<M> for MemoryTransport<M> {
    fn id(&self) -> NodeId {
        self.id
    }

    fn peers(&self) -> Vec<NodeId> {
        let mut peers: Vec<NodeId> = self
            .network
            .members
            .read()
            .keys()
            .copied()
            .filter(|&n| n != self.id)
            .collect();
        peers.sort_unstable();
        peers
    }

    fn send(&self, to: NodeId, msg: M) -> Result<(), SendError> {
        let receiver = {
            let members = self.network.members.read();
            if !members.contains_key(&self.id) {
                return Err(SendError::Closed);
            }
            members
                .get(&to)
                .cloned()
                .ok_or(SendError::UnknownPeer(to))?
        };
        if receiver.faults.refuse_incoming(self.id) {
            return Ok(());
        }
        let receiver = receiver.deliver;
        match self.faults.outgoing(to) {
            Verdict::Drop => {}
            Verdict::Pass => receiver.message(self.id, msg),
            Verdict::Delay(d) => {
                let from = self.id;
                let handle = tokio::runtime::Handle::try_current()
                    .ok()
                    .or_else(|| self.runtime.clone())
                    .ok_or(SendError::Closed)?;
                handle.spawn(async move {
                    tokio::time::sleep(d).await;
                    receiver.message(from, msg);
                });
            }
        }
        Ok(())
    }

    fn faults(&self) -> &FaultRules {
        &self.faults
    }

    fn shutdown(&self) {
        self.network.leave(self.id, &self.faults);
    }
}
