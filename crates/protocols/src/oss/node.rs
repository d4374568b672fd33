//! One OSS node as a deterministic state machine: its domains' logs, the sequencer it runs
//! when the control log names it, its application's commits, and the control log's order
//! replica beside them (see docs/design/oss.md).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use atomos_core::{Engine, Key};
use atomos_order::{decode_log, Endpoint, EndpointConfig, OrderError, Replica, ReplicaConfig};
use atomos_seam::stable::{mix64, GOLDEN};
use atomos_seam::{Input, Machine, Output, Write};
use rustc_hash::{FxHashMap, FxHashSet};

use super::control::{Control, ControlEntry, DomainState};
use super::domain_log::DomainLog;
use super::msg::{OssDelivery, OssMsg, OssRecord};
use super::sequencer::{CommitRequest, Sequencer};
use super::token::TokenState;
use super::write_set::{CommitId, DomainId, TxId};

/// Settings of an OSS node.
#[derive(Clone, Debug)]
pub struct OssConfig {
    /// This node.
    pub id: u64,
    /// Every member, this one included.
    pub members: Vec<u64>,
    /// The consistency domains' key prefixes; a key belongs to the domain of the longest
    /// prefix it starts with, and to domain 0 if none (domain 0's prefix is usually "").
    pub domains: Vec<String>,
    /// Keys under this prefix are this node's alone: never replicated, committed locally.
    pub local_prefix: String,
    /// Applied write sets kept per domain for others who missed them.
    pub history_max: usize,
    /// Ticks a missing write set is waited for before it is fetched.
    pub gap_after: u64,
    /// Ticks before a commit request without an answer is sent again.
    pub resend_after: u64,
    /// Ticks without progress on a commit before its domain's epoch is suspected.
    pub suspect_after: u64,
    /// The held watermarks are told again every this many ticks (messages may be lost).
    pub held_every: u64,
    /// The control log's order replica (its id and replicas are this node's and the
    /// members'). Its seed also tells this run's transaction ids from other runs': draw it
    /// anew at each start.
    pub replica: ReplicaConfig,
    /// How commits are numbered: by an ultra-peer, or by whoever holds the token.
    pub commit: CommitMode,
    /// A bug planted on purpose, to show the simulation catches it (tests only).
    pub planted_bug: Option<OssBug>,
    /// This node lost its log (a wiped disk): until it holds every write set the others
    /// hold, it reports no mark when an epoch is suspected (what it held before is gone, and a
    /// low mark could let the next epoch start below a committed id). Also set on the control
    /// replica (`replica.rejoin`), which withholds its votes meanwhile.
    pub rejoin: bool,
}

/// How a domain's commits are numbered (OSS III, IV). Epochs, recovery and installing
/// write sets are the same in every mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CommitMode {
    /// Ultra-peer commit: the epoch's named node numbers every node's commits (figure 3).
    #[default]
    UltraPeer,
    /// Peer-to-peer commit with distributed token passing: the token goes to whoever asks,
    /// requests follow the predicted holder and travel inside the token (figure 4).
    DistributedToken,
    /// Peer-to-peer commit with coordinator-based token passing: requests go to the epoch's
    /// named node, which hands the token out; it returns there when nobody waits (figure 5).
    CoordinatorToken,
}

impl CommitMode {
    /// Every mode, by its name in configurations and on the command line.
    pub const NAMES: [(&'static str, CommitMode); 3] = [
        ("ultra-peer", CommitMode::UltraPeer),
        ("distributed-token", CommitMode::DistributedToken),
        ("coordinator-token", CommitMode::CoordinatorToken),
    ];

    /// The mode named `name`.
    pub fn parse(name: &str) -> Option<CommitMode> {
        CommitMode::NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, m)| *m)
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        CommitMode::NAMES
            .iter()
            .find(|(_, m)| *m == self)
            .map_or("ultra-peer", |(n, _)| n)
    }
}

/// Bugs the simulation must catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OssBug {
    /// The sequencer numbers every request without validating its reads.
    SkipValidation,
    /// A write set counts as stable once one node holds it (no majority awaited).
    StableAtOne,
    /// A node takes a token again when the network delivers it twice (no hop check).
    TokenTakenTwice,
}

impl OssConfig {
    /// Node `id` of `members`: one domain for every key, `local/` keys node-local, 10,000
    /// write sets of history, fetch after 5 ticks, re-send after 10, suspect after 40, held
    /// watermarks re-told every 5; the control log never compacts (its entries are few).
    pub fn new(id: u64, members: Vec<u64>) -> OssConfig {
        let mut replica = ReplicaConfig::new(id, members.clone());
        replica.snapshot_every = u64::MAX;
        OssConfig {
            id,
            members,
            domains: vec![String::new()],
            local_prefix: "local/".into(),
            history_max: 10_000,
            gap_after: 5,
            resend_after: 10,
            suspect_after: 40,
            held_every: 5,
            replica,
            commit: CommitMode::UltraPeer,
            planted_bug: None,
            rejoin: false,
        }
    }
}

/// Why a node cannot go on (it must restart from its disk).
#[derive(Debug, thiserror::Error)]
pub enum OssError {
    /// The control log's replica failed.
    #[error("control log: {0}")]
    Order(#[from] OrderError),
    /// A record of the log does not decode.
    #[error("log record {index} does not decode: {reason}")]
    Record {
        /// Its place in the log.
        index: usize,
        /// The decoder's explanation.
        reason: String,
    },
    /// The configuration cannot work.
    #[error("bad configuration: {0}")]
    Config(String),
    /// The control replica asked for something this node does not do.
    #[error("the control log asked to {0}, which an OSS node does not do")]
    Unsupported(&'static str),
}

/// A request of the application on this node.
#[derive(Clone, Debug, PartialEq)]
pub enum OssRequest {
    /// Commit a transaction: `tx` is the caller's number for it; `reads` the engine versions
    /// it read; `writes` what it wrote.
    Commit {
        /// The caller's number.
        tx: u64,
        /// Each key read, with the engine version read (0: never written).
        reads: Vec<(Key, u64)>,
        /// Each key written once (`None`: deleted).
        writes: Vec<(Key, Option<Vec<u8>>)>,
    },
    /// A commit of nothing through domain 0's sequencer: once it is answered, this node has
    /// installed every commit of that domain acknowledged anywhere before the request.
    Barrier {
        /// The caller's number.
        tx: u64,
    },
}

/// One domain on this node.
#[derive(Debug)]
pub(super) struct DomainNode {
    pub(super) log: DomainLog,
    /// Its epoch as the control log decided.
    pub(super) state: DomainState,
    /// This node numbers the domain's commits in the current epoch (once caught up).
    pub(super) sequencer: Option<Sequencer>,
    /// Requests that came while this node's sequencer was catching up.
    pub(super) waiting: Vec<(u64, CommitRequest)>,
    /// Transactions numbered in this epoch (a re-sent request is numbered once).
    pub(super) numbered: FxHashSet<TxId>,
    /// Write sets numbered in this step, sent to every node at its end.
    pub(super) outbox: Vec<super::write_set::WriteSet>,
    /// Reports of the suspected epoch: node -> mark.
    pub(super) reports: BTreeMap<u64, CommitId>,
    /// Since when a gap has waited (ticks).
    pub(super) gap_since: Option<u64>,
    /// The tick the domain last made progress here (applied, or an epoch started).
    pub(super) progress_at: u64,
    /// The tick this node last ordered a suspicion or a start for the domain.
    pub(super) proposed_at: Option<u64>,
    /// This node sequenced the current epoch before it restarted: it does not resume (it
    /// lost which requests it numbered), and has the epoch suspected. In a token mode: it
    /// may have held the token (or lost which hops it took), so it takes none in this
    /// epoch, and has it suspected.
    pub(super) orphaned: bool,
    /// The domain's token here (token modes).
    pub(super) token: TokenState,
    /// A digest of the commits applied (see [`OssNode::applied_digest`]).
    pub(super) digest: u64,
}

/// A commit of this node's application waiting for its outcome.
#[derive(Debug)]
pub(super) struct Pending {
    /// Who waits for it (`None`: sent by an earlier run of this node, replayed from the log).
    pub(super) caller: Option<u64>,
    pub(super) domain: DomainId,
    pub(super) request: CommitRequest,
    /// Its writes to node-local keys, installed with its write set.
    pub(super) local_writes: Vec<(Key, Option<Vec<u8>>)>,
    /// Its reads of node-local keys (no local commit may write them meanwhile).
    pub(super) local_reads: Vec<Key>,
    /// The epoch it was sent in.
    pub(super) epoch: u64,
    /// When it was last sent (ticks).
    pub(super) sent_at: u64,
    /// When it was first sent (ticks).
    pub(super) since: u64,
    /// After an epoch change: its fate is known once the domain applied through this id.
    pub(super) decided_through: Option<CommitId>,
}

/// A commit of node-local keys only, waiting for its disk write.
#[derive(Debug)]
pub(super) struct LocalCommit {
    /// The write that persists it.
    pub(super) write: u64,
    pub(super) caller: u64,
    pub(super) reads: Vec<(Key, u64)>,
    pub(super) writes: Vec<(Key, Option<Vec<u8>>)>,
}

/// An OSS node.
pub struct OssNode {
    pub(super) cfg: OssConfig,
    pub(super) engine: Arc<Engine>,
    /// The control log: its replica and this node's client, as one machine.
    pub(super) endpoint: Endpoint<Control>,
    /// Control entries this node submitted (the latest one's ticket).
    pub(super) proposals: u64,
    /// The control entry in flight, with its ticket: one at a time.
    pub(super) proposing: Option<(u64, ControlEntry)>,
    /// Control entries waiting for the one in flight.
    pub(super) proposals_waiting: VecDeque<ControlEntry>,
    pub(super) domains: Vec<DomainNode>,
    /// The engine version of the last write installed here.
    pub(super) position: u64,
    /// Each replicated key's newest applied commit id.
    pub(super) key_cid: FxHashMap<Key, CommitId>,
    /// This node's commits waiting for their outcome, by transaction.
    pub(super) pending: BTreeMap<TxId, Pending>,
    /// Local commits persisted and not yet durable, in order.
    pub(super) local_queue: Vec<LocalCommit>,
    pub(super) incarnation: u64,
    /// This run's id (see [`TxId::run`]); its high 32 bits are its control clients' id base.
    pub(super) run: u64,
    pub(super) next_tx: u64,
    /// Writes emitted so far (numbered from 1, as `Persisted` counts them).
    pub(super) writes: u64,
    /// Writes durable through this number.
    pub(super) durable: u64,
    /// The control replica's writes so far (its own numbering, as its `Persisted` counts).
    pub(super) replica_writes: u64,
    /// The control replica's writes not yet durable: (this node's number, the replica's).
    pub(super) replica_unsynced: VecDeque<(u64, u64)>,
    pub(super) ticks: u64,
    /// The incarnation record is written at the first step.
    pub(super) announced: bool,
    /// Counters for tests and operators.
    pub(super) counters: OssCounters,
    /// Rejoining: the answers of non-rejoining nodes to this run's probe (node -> each
    /// domain's held watermark).
    pub(super) rejoin_answers: BTreeMap<u64, Vec<CommitId>>,
    /// After a restart, each domain's held watermark as the log left it: commits wait until
    /// every domain applied that far (a transaction must not read what it installed before
    /// the restart as older than it was).
    pub(super) recovering: Vec<CommitId>,
    /// Rejoining after losing its log (see [`OssConfig::rejoin`]): no reports yet.
    pub(super) rejoining: bool,
    /// The log says whether it rejoins (then the configuration's `rejoin` no longer does:
    /// an operator may leave it on).
    pub(super) rejoin_logged: bool,
}

/// A transaction's writes: each key once, `None` for a deletion.
pub(super) type Writes = Vec<(Key, Option<Vec<u8>>)>;

/// What a node counted since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OssCounters {
    /// Commits of node-local keys only.
    pub local_commits: u64,
    /// This node's commits that went through a sequencer and committed.
    pub commits: u64,
    /// Its commits that aborted.
    pub aborts: u64,
    /// Write sets this node numbered as a sequencer.
    pub numbered: u64,
    /// Write sets applied here.
    pub applied: u64,
    /// Fetches of missing write sets sent.
    pub fetches: u64,
    /// Suspicions this node ordered.
    pub suspicions: u64,
    /// Epochs started here.
    pub epochs: u64,
    /// Tokens passed to another node.
    pub token_passes: u64,
}

impl OssCounters {
    /// Each counter with its name (for metrics: `atomos_oss_<name>_total`).
    pub fn named(&self) -> [(&'static str, u64); 9] {
        [
            ("local_commits", self.local_commits),
            ("commits", self.commits),
            ("aborts", self.aborts),
            ("numbered", self.numbered),
            ("applied", self.applied),
            ("fetches", self.fetches),
            ("suspicions", self.suspicions),
            ("epochs", self.epochs),
            ("token_passes", self.token_passes),
        ]
    }
}

/// What a step appends.
pub type OssOutput = Output<OssMsg, OssDelivery>;

/// A run's id, mixed from the configuration's seed and the incarnation.
fn run_id(seed: u64, incarnation: u64) -> u64 {
    mix(seed, incarnation)
}

/// Mixes `v` into `h`: deterministic on every machine.
pub(super) fn mix(h: u64, v: u64) -> u64 {
    mix64(h ^ v.wrapping_mul(GOLDEN))
}

impl OssNode {
    /// Node `cfg.id` over `engine` (made for replication, holding nothing yet), rebuilt from
    /// the records its disk kept.
    pub fn open(
        cfg: OssConfig,
        engine: Arc<Engine>,
        records: &[Vec<u8>],
    ) -> Result<OssNode, OssError> {
        if cfg.domains.is_empty() || !cfg.members.contains(&cfg.id) {
            return Err(OssError::Config(
                "at least one domain, and this node among the members".into(),
            ));
        }
        if !engine.config().replicated {
            return Err(OssError::Config(
                "the engine is not made for replication".into(),
            ));
        }
        let mut decoded = Vec::with_capacity(records.len());
        for (index, bytes) in records.iter().enumerate() {
            let r = OssRecord::decode(bytes).map_err(|e| OssError::Record {
                index,
                reason: e.to_string(),
            })?;
            decoded.push(r);
        }
        let order: Vec<Vec<u8>> = decoded
            .iter()
            .filter_map(|r| match r {
                OssRecord::Order(b) => Some(b.clone()),
                _ => None,
            })
            .collect();
        let replica = Replica::open(cfg.replica.clone(), decode_log(&order)?, Control::new())?;
        let incarnation = decoded
            .iter()
            .filter_map(|r| match r {
                OssRecord::Incarnation(n) => Some(*n),
                _ => None,
            })
            .max()
            .unwrap_or(0)
            + 1;
        let majority_of = match cfg.planted_bug {
            Some(OssBug::StableAtOne) => 1,
            _ => cfg.members.len(),
        };
        let domains = (0..cfg.domains.len())
            .map(|_| DomainNode {
                log: DomainLog::new(majority_of, cfg.history_max),
                state: DomainState {
                    epoch: 0,
                    sequencer: 0,
                    first: 1,
                    suspected: false,
                    mode: CommitMode::UltraPeer,
                },
                sequencer: None,
                waiting: Vec::new(),
                numbered: FxHashSet::default(),
                outbox: Vec::new(),
                reports: BTreeMap::new(),
                gap_since: None,
                progress_at: 0,
                proposed_at: None,
                orphaned: false,
                token: TokenState::default(),
                digest: 0,
            })
            .collect();
        let run = run_id(cfg.replica.seed, incarnation);
        let endpoint_cfg = EndpointConfig {
            // The run's id, so a restarted node's client never reuses an earlier one's ids.
            client_base: run & !0xFFFF_FFFF,
            resend_ticks: cfg.resend_after.max(1) * 2,
        };
        let endpoint = Endpoint::new(replica, &cfg.members, endpoint_cfg);
        let mut node = OssNode {
            cfg,
            engine,
            endpoint,
            proposals: 0,
            proposing: None,
            proposals_waiting: VecDeque::new(),
            domains,
            position: 0,
            key_cid: FxHashMap::default(),
            pending: BTreeMap::new(),
            local_queue: Vec::new(),
            incarnation,
            run,
            next_tx: 0,
            writes: 0,
            durable: 0,
            replica_writes: 0,
            replica_unsynced: VecDeque::new(),
            ticks: 0,
            announced: false,
            counters: OssCounters::default(),
            rejoin_answers: BTreeMap::new(),
            recovering: Vec::new(),
            rejoining: false,
            rejoin_logged: false,
        };
        node.replay(decoded);
        Ok(node)
    }

    /// Rebuilds the domains' logs and the node-local objects from the records, in order.
    fn replay(&mut self, records: Vec<OssRecord>) {
        for r in records {
            match r {
                OssRecord::WriteSet(ws) => {
                    if let Some(d) = self.domains.get_mut(ws.domain as usize) {
                        d.log.offer(ws, 0);
                    }
                }
                OssRecord::Local { writes, applied } => {
                    // Installed as it was: after the write sets applied when it committed.
                    self.replay_applied(&applied);
                    self.position += 1;
                    self.engine.apply_certified(self.position, &[], writes);
                }
                OssRecord::LocalOf {
                    domain,
                    epoch,
                    request,
                    writes,
                    local_reads,
                    applied,
                } => {
                    self.replay_applied(&applied);
                    // Waits again, for nobody: it guards its node-local keys until its fate
                    // is known, and is sent again (it may commit now).
                    if self.domains.get(domain as usize).is_none() {
                        continue;
                    }
                    let tx = request.tx;
                    self.pending.insert(
                        tx,
                        Pending {
                            caller: None,
                            domain,
                            request,
                            local_writes: writes,
                            local_reads,
                            epoch,
                            sent_at: 0,
                            since: 0,
                            decided_through: None,
                        },
                    );
                }
                OssRecord::Fenced { domain, epoch } => {
                    if let Some(d) = self.domains.get_mut(domain as usize) {
                        d.log.fence(epoch);
                        d.state.suspected = true;
                    }
                }
                OssRecord::Started { domain, state } => {
                    if let Some(d) = self.domains.get_mut(domain as usize) {
                        d.log.start(state.epoch, state.first);
                        d.state = state;
                        d.token = TokenState::new(state.sequencer);
                        // As when it started live: an epoch that started while the node
                        // rejoined is never resumed (it lost what it did in it before).
                        d.orphaned = self.rejoining;
                    }
                }
                OssRecord::TokenTaken { domain, epoch, hop } => {
                    if let Some(d) = self.domains.get_mut(domain as usize) {
                        if d.state.epoch == epoch {
                            d.token.taken = d.token.taken.max(Some(hop));
                        }
                    }
                }
                OssRecord::Refused(tx) => {
                    self.pending.remove(&tx);
                }
                OssRecord::Rejoining(on) => {
                    self.rejoining = on;
                    self.rejoin_logged = true;
                }
                OssRecord::Incarnation(_) | OssRecord::Order(_) => {}
            }
        }
        let me = self.cfg.id;
        for d in &mut self.domains {
            d.log.durable(0);
            // It may have held the token when it stopped (the epoch's start gives it to the
            // named node).
            let token_mode = d.state.mode != CommitMode::UltraPeer;
            let held_role = d.state.sequencer == me || (token_mode && d.token.taken.is_some());
            // (Or the epoch started while it rejoined: then it knows nothing of its tokens.)
            d.orphaned |= d.state.epoch > 0 && held_role && !d.state.suspected;
        }
        // Replayed commits sent in an earlier epoch learn their fate as after a start.
        for p in self.pending.values_mut() {
            if let Some(d) = self.domains.get(p.domain as usize) {
                if p.epoch < d.state.epoch {
                    p.decided_through = Some(d.state.first - 1);
                }
            }
        }
        self.recovering = self.domains.iter().map(|d| d.log.held()).collect();
    }

    /// Replay: installs every domain's write sets through `applied` (they were stable, and
    /// are on this disk before the record that names them).
    fn replay_applied(&mut self, applied: &[CommitId]) {
        for (d, &through) in self.domains.iter_mut().zip(applied) {
            d.log.durable(0);
            d.log.was_stable(through);
        }
        let mut ignored = Vec::new();
        self.apply_stable(&mut ignored);
    }

    /// The engine this node installs into.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// What the node counted since it started.
    pub fn counters(&self) -> OssCounters {
        self.counters
    }

    /// Domain `d`'s epoch and watermarks here: (epoch, held, stable, applied).
    pub fn watermarks(&self, d: DomainId) -> Option<(u64, CommitId, CommitId, CommitId)> {
        self.domains
            .get(d as usize)
            .map(|x| (x.log.epoch(), x.log.held(), x.log.stable(), x.log.applied()))
    }

    /// Control-log entries this node has submitted and not yet seen ordered: at most one
    /// (the others wait for it), however long the control log cannot order.
    pub fn control_proposals_in_flight(&self) -> usize {
        self.endpoint.in_flight()
    }

    /// Domain `d`'s applied watermark with a digest of every (commit id, transaction) applied
    /// through it, in order: two nodes at the same watermark with different digests applied
    /// different commits under one id.
    pub fn applied_digest(&self, d: DomainId) -> Option<(CommitId, u64)> {
        let x = self.domains.get(d as usize)?;
        Some((x.log.applied(), x.digest))
    }

    /// Whether this node still installs what its log held before it restarted.
    pub(super) fn is_recovering(&self) -> bool {
        self.domains
            .iter()
            .zip(&self.recovering)
            .any(|(d, &mark)| d.log.applied() < mark)
    }

    /// A rejoining node has caught up once its control replica has, and enough other nodes
    /// that are not rejoining themselves answered this run's probe (so after it lost its
    /// log) that every majority it was part of before includes one of them (all but a
    /// majority less one), and it holds, in every domain, as much as the most of them: it
    /// then holds every id that was stable before. From then on it reports its marks.
    fn check_rejoined(&mut self, out: &mut Vec<OssOutput>) {
        if !self.rejoining || self.endpoint.replica().rejoining() {
            return;
        }
        let needed = self.cfg.members.len() - self.majority() + 1;
        let caught_up = self.rejoin_answers.len() >= needed
            && self.domains.iter().enumerate().all(|(i, d)| {
                let most = self
                    .rejoin_answers
                    .values()
                    .filter_map(|held| held.get(i).copied())
                    .max()
                    .unwrap_or(0);
                d.log.held() >= most
            });
        if caught_up {
            self.rejoining = false;
            // The current epoch may be one it sequenced before it lost its log (what it
            // numbered then is gone): it has the epoch suspected instead of resuming it.
            let me = self.cfg.id;
            for d in &mut self.domains {
                let token_mode = d.state.mode != CommitMode::UltraPeer;
                if d.state.epoch > 0 && (d.state.sequencer == me || token_mode) {
                    d.orphaned = true;
                }
            }
            self.persist(vec![OssRecord::Rejoining(false)], out);
        }
    }

    /// Whether `key` is this node's alone.
    pub(super) fn is_local(&self, key: &Key) -> bool {
        key.as_bytes().starts_with(self.cfg.local_prefix.as_bytes())
    }

    /// The domain of a replicated key: the longest matching prefix's, else 0.
    pub(super) fn domain_of(&self, key: &Key) -> DomainId {
        let bytes = key.as_bytes();
        self.cfg
            .domains
            .iter()
            .enumerate()
            .filter(|(_, p)| bytes.starts_with(p.as_bytes()))
            .max_by_key(|(_, p)| p.len())
            .map_or(0, |(i, _)| i as DomainId)
    }

    /// Emits a disk write of `records`; returns its number.
    pub(super) fn persist(&mut self, records: Vec<OssRecord>, out: &mut Vec<OssOutput>) -> u64 {
        self.writes += 1;
        out.push(Output::Persist(Write::Append(
            records.iter().map(OssRecord::encode).collect(),
        )));
        self.writes
    }

    /// Sends `msg` to every other member.
    pub(super) fn broadcast(&self, msg: OssMsg, out: &mut Vec<OssOutput>) {
        for &m in &self.cfg.members {
            if m != self.cfg.id {
                out.push(Output::Send {
                    to: m,
                    msg: msg.clone(),
                });
            }
        }
    }

    /// A majority of the members.
    pub(super) fn majority(&self) -> usize {
        self.cfg.members.len() / 2 + 1
    }
}

impl Machine for OssNode {
    type Msg = OssMsg;
    type Request = OssRequest;
    type Delivery = OssDelivery;
    type Error = OssError;

    fn step(
        &mut self,
        _now: u64,
        input: Input<OssMsg, OssRequest>,
        out: &mut Vec<OssOutput>,
    ) -> Result<(), OssError> {
        if !self.announced {
            self.announced = true;
            let mut records = vec![OssRecord::Incarnation(self.incarnation)];
            if self.cfg.rejoin && !self.rejoin_logged {
                self.rejoining = true;
                records.push(OssRecord::Rejoining(true));
            }
            self.persist(records, out);
        }
        match input {
            Input::Tick => {
                self.ticks += 1;
                self.control_step(Input::Tick, out)?;
                self.on_tick(out)?;
            }
            Input::Message {
                from,
                msg: OssMsg::Order(m),
            } => self.control_step(Input::Message { from, msg: m }, out)?,
            Input::Message { from, msg } => self.on_message(from, msg, out)?,
            Input::Request(OssRequest::Commit { tx, reads, writes }) => {
                self.commit(tx, reads, writes, out)?
            }
            Input::Request(OssRequest::Barrier { tx }) => self.barrier(tx, out),
            Input::Persisted { through } => self.on_durable(through, out)?,
        }
        self.after_step(out)?;
        self.check_rejoined(out);
        Ok(())
    }
}
