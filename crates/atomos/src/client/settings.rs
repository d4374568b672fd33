//! What a remote client is given (its cluster, secret, key, members, limits) and why an
//! invocation or a connection fails.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use atomos_core::TxError;
use atomos_net::keys::{KeyPair, PublicKey};
use atomos_net::transport::NodeId;

use crate::wire::Refusal;

/// How a client reaches its cluster. [`ClientConfig::new`] gives the defaults.
#[derive(Clone)]
pub struct ClientConfig {
    /// The cluster's name.
    pub cluster: String,
    /// The cluster's secret (the one its members share).
    pub secret: Vec<u8>,
    /// This client's key pair: the members admit its public key.
    pub key: KeyPair,
    /// The members: id and address of each.
    pub members: Vec<(NodeId, SocketAddr)>,
    /// The public keys each member may prove (two while it rotates its key).
    pub member_keys: BTreeMap<NodeId, Vec<PublicKey>>,
    /// The member tried first (`None`: one picked at random, which spreads clients).
    pub reference: Option<NodeId>,
    /// A member that did not answer within this long is replaced by the next.
    pub resend_after: Duration,
    /// How long one invocation (or connecting) may take before it fails.
    pub limit: Duration,
    /// Largest message accepted or sent, in bytes.
    pub max_frame: usize,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("cluster", &self.cluster)
            .field("secret", &"<hidden>")
            .field("key", &self.key)
            .field("members", &self.members)
            .field("member_keys", &self.member_keys)
            .field("reference", &self.reference)
            .field("resend_after", &self.resend_after)
            .field("limit", &self.limit)
            .finish()
    }
}

impl ClientConfig {
    /// A client of `cluster` with `secret` and `key`, reaching `members` (id, address and
    /// public key of each); re-sends after 500 ms, gives up on an invocation after 10 s, 16 MiB
    /// messages.
    pub fn new(
        cluster: impl Into<String>,
        secret: impl Into<Vec<u8>>,
        key: KeyPair,
        members: Vec<(NodeId, SocketAddr, PublicKey)>,
    ) -> ClientConfig {
        ClientConfig {
            cluster: cluster.into(),
            secret: secret.into(),
            key,
            member_keys: members.iter().map(|&(id, _, k)| (id, vec![k])).collect(),
            members: members.into_iter().map(|(id, a, _)| (id, a)).collect(),
            reference: None,
            resend_after: Duration::from_millis(500),
            limit: Duration::from_secs(10),
            max_frame: atomos_net::frame::DEFAULT_MAX_FRAME,
        }
    }
}

/// Why a client could not connect, or an invocation did not return a result.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The configuration cannot work (no members, an empty secret, a bad id, ...).
    #[error("bad client configuration: {0}")]
    Config(String),
    /// No member answered while connecting.
    #[error("no member of the cluster answered within {0:?}")]
    Unreachable(Duration),
    /// No procedure of that name is registered on the cluster.
    #[error("no procedure named {name:?} is registered on the cluster")]
    NoSuchProcedure {
        /// The name asked for.
        name: String,
    },
    /// The arguments or the result do not fit the procedure's types.
    #[error("procedure {name:?}: {reason}")]
    Types {
        /// The procedure.
        name: String,
        /// What did not fit.
        reason: String,
    },
    /// The procedure ran and failed (its own error, or its transaction could not commit):
    /// it wrote nothing.
    #[error("procedure {name:?} failed: {reason}")]
    Failed {
        /// The procedure.
        name: String,
        /// Why.
        reason: String,
    },
    /// The cluster did not run the invocation (an update procedure on a cluster that does
    /// not run `active`, and the like).
    #[error("procedure {name:?} refused: {reason}")]
    Refused {
        /// The procedure.
        name: String,
        /// Why.
        reason: String,
    },
    /// The member serves as many client requests at once as it allows: this one was not
    /// started (it never ran). Try again later, or another member.
    #[error("procedure {name:?} not started: {reason}")]
    Busy {
        /// The procedure.
        name: String,
        /// The member's explanation.
        reason: String,
    },
    /// The update was not ordered within the client's limit: it never runs.
    #[error("procedure {name:?} not ordered within {limit:?}: it never runs")]
    Expired {
        /// The procedure.
        name: String,
        /// The limit that passed.
        limit: Duration,
    },
    /// No answer came within the limit: an update may still run (it stays outstanding, and
    /// is decided by its deadline, the limit, once a majority of the cluster is back).
    #[error("procedure {name:?}: no answer within {limit:?}; it may still run")]
    OutcomeUnknown {
        /// The procedure.
        name: String,
        /// The limit that passed.
        limit: Duration,
    },
    /// The client was closed.
    #[error("the client is closed")]
    Closed,
    /// No member served a backup (what each said, the last first).
    #[error("no backup taken: {0}")]
    Backup(String),
}

impl ClientError {
    /// A member's refusal; `limit` is the client's own, named when the outcome is unknown.
    pub(super) fn from_refusal(name: &str, refusal: Refusal, limit: Duration) -> ClientError {
        let name = name.to_string();
        match refusal {
            Refusal::NoSuchProcedure(_) => ClientError::NoSuchProcedure { name },
            Refusal::Types(reason) => ClientError::Types { name, reason },
            Refusal::Failed(reason) => ClientError::Failed { name, reason },
            Refusal::Refused(reason) => ClientError::Refused { name, reason },
            Refusal::Busy(reason) => ClientError::Busy { name, reason },
            Refusal::Unknown(_) => ClientError::OutcomeUnknown { name, limit },
        }
    }

    pub(super) fn from_tx(name: &str, e: TxError) -> ClientError {
        match e {
            TxError::ProcedureTypes { reason, .. } => ClientError::Types {
                name: name.to_string(),
                reason,
            },
            other => ClientError::Refused {
                name: name.to_string(),
                reason: other.to_string(),
            },
        }
    }
}
