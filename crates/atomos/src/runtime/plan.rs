//! How a node runs its protocol among its members: one [`ProtocolPlan`] for every protocol, and
//! the one place ([`NodeRuntime::start_protocol`]) that turns it into the protocol the node was
//! made for. A node from a configuration file, an in-process cluster and the benchmark's
//! clusters all start their protocol here.

use std::path::PathBuf;

use atomos_net::transport::NodeId;
use atomos_order::ReplicaConfig;
use atomos_protocols::oss::{CommitMode, OssConfig};
use atomos_protocols::tfa::TfaConfig;

use super::{NodeRuntime, RuntimeError};
use crate::certify::CertifyOptions;
use crate::disk::FsyncPolicy;
use crate::node::Protocol;
use crate::ordering::OrderNodeConfig;

/// What a node needs to run its protocol (the one its [`Node`](crate::Node) was made for)
/// among its members. Each field says which protocols read it; the others ignore it.
#[derive(Clone, Debug)]
pub struct ProtocolPlan {
    /// Every member's id, this node's included: the same list on every member.
    pub members: Vec<NodeId>,
    /// The directory the protocol keeps its log in (`tfa.wal`, `oss.wal`, `certify.wal` or
    /// `active.wal`; created if missing), and how the log is synced. `None`: kept nowhere, so
    /// a restart forgets what the node held.
    pub log: Option<(PathBuf, FsyncPolicy)>,
    /// certify, active, oss: this node lost its log (its data directory was wiped) and the
    /// cluster has a history: it neither votes nor campaigns until it has caught up.
    pub rejoin: bool,
    /// certify, active: this node joins a running cluster (`members` are ignored: it learns
    /// the membership from the leader's snapshot once a member adds it as a learner). The
    /// other protocols do not change members, and refuse it.
    pub join: bool,
    /// certify, active (and the commit limit, oss): how commits wait and the store's
    /// housekeeping.
    pub certify: CertifyOptions,
    /// certify, active: a snapshot of the replicated store every this many entries.
    pub snapshot_every: u64,
    /// certify, active: snapshots go to other replicas in chunks of at most this many bytes.
    pub snapshot_chunk_bytes: usize,
    /// oss: the commit protocol.
    pub oss_commit: CommitMode,
    /// oss: the consistency domains besides the default one (key prefixes).
    pub oss_domains: Vec<String>,
    /// oss: installed write sets kept per domain for nodes that missed them.
    pub oss_history_max: usize,
    /// oss: the log is compacted every this many records.
    pub oss_compact_after: usize,
    /// tfa: the protocol's settings.
    pub tfa: TfaConfig,
}

impl ProtocolPlan {
    /// A plan for `members` with every other setting at its default: no log, the default
    /// commit limit and housekeeping, a snapshot every 10,000 entries, oss's default commit
    /// protocol and one consistency domain, TFA's defaults.
    pub fn new(members: Vec<NodeId>) -> ProtocolPlan {
        let oss = OssConfig::new(0, Vec::new());
        ProtocolPlan {
            members,
            log: None,
            rejoin: false,
            join: false,
            certify: CertifyOptions::default(),
            snapshot_every: ReplicaConfig::new(1, vec![1]).snapshot_every,
            snapshot_chunk_bytes: ReplicaConfig::new(1, vec![1]).snapshot_chunk_bytes,
            oss_commit: oss.commit,
            oss_domains: Vec::new(),
            oss_history_max: oss.history_max,
            oss_compact_after: oss.compact_after,
            tfa: TfaConfig::default(),
        }
    }

    /// Where the protocol's log named `name` goes, creating the directory.
    fn log_file(&self, name: &str) -> Result<Option<(PathBuf, FsyncPolicy)>, RuntimeError> {
        let Some((dir, fsync)) = &self.log else {
            return Ok(None);
        };
        std::fs::create_dir_all(dir).map_err(|source| RuntimeError::DataDir {
            path: dir.clone(),
            source,
        })?;
        Ok(Some((dir.join(name), *fsync)))
    }
}

impl NodeRuntime {
    /// Runs the protocol this node was made for as `plan` says: TFA, oss, or an order replica
    /// with the replicated store (certify, active); nothing for `local`. Each start draws its
    /// own seed (batch numbers, election jitter). Fails if the log cannot be opened or read,
    /// the members lack this node, or a protocol already runs here.
    pub fn start_protocol(&mut self, plan: ProtocolPlan) -> Result<(), RuntimeError> {
        let mut members = plan.members.clone();
        members.sort_unstable();
        let protocol = self.node.protocol();
        if plan.join && !protocol.is_ordered() {
            return Err(RuntimeError::Protocol {
                name: "join",
                why: format!(
                    "only certify and active clusters change their members: a node cannot \
                     join one running {protocol}"
                ),
            });
        }
        match protocol {
            Protocol::Local => Ok(()),
            Protocol::Tfa => {
                let log = plan.log_file("tfa.wal")?;
                self.start_tfa(members, plan.tfa, log)
            }
            Protocol::Oss => {
                let log = plan.log_file("oss.wal")?;
                let mut cfg = OssConfig::new(self.id, members);
                cfg.replica.seed = rand::random();
                cfg.commit = plan.oss_commit;
                cfg.domains.extend(plan.oss_domains);
                cfg.history_max = plan.oss_history_max;
                cfg.compact_after = plan.oss_compact_after;
                cfg.rejoin = plan.rejoin;
                cfg.replica.rejoin = plan.rejoin;
                self.start_oss(cfg, log, plan.certify.commit_limit)
            }
            protocol @ (Protocol::Certify | Protocol::Active) => {
                let founders = if plan.join { Vec::new() } else { members };
                let mut replica = ReplicaConfig::new(self.id, founders);
                replica.seed = rand::random();
                replica.snapshot_every = plan.snapshot_every;
                replica.snapshot_chunk_bytes = plan.snapshot_chunk_bytes;
                replica.rejoin = plan.rejoin;
                let mut order = OrderNodeConfig::new(replica);
                order.wal = plan.log_file(&format!("{protocol}.wal"))?;
                self.start_certify(order, plan.certify)
            }
        }
    }
}
