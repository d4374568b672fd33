//! One OSS node as a deterministic state machine: its domains' logs, the sequencer it runs
//! when the control log names it, its application's commits, and the control log's order
//! replica beside them (see docs/design/oss.md).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use atomos_core::{Engine, Key};
use atomos_order::Endpoint;
use atomos_seam::stable::{mix64, GOLDEN};
use atomos_seam::{Input, Machine, Output, Write};
use rustc_hash::{FxHashMap, FxHashSet};

use super::compaction::Kept;
use super::config::OssConfig;
use super::control::{Control, ControlEntry, DomainState};
use super::domain_log::DomainLog;
use super::image::{Assembly, DomainImage};
use super::msg::{OssDelivery, OssMsg, OssRecord};
use super::sequencer::{CommitRequest, Sequencer};
use super::token_state::TokenState;
use super::vocabulary::{OssCounters, OssError, OssOutput, OssRequest};
use super::write_set::{CommitId, DomainId, TxId};

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
    /// An image received whole, with the write that persists it: installed once durable.
    pub(super) image: Option<(u64, DomainImage)>,
    /// The parts of an image received so far, from each member sending one.
    pub(super) assembly: BTreeMap<u64, Assembly>,
    /// When this node last sent an image of the domain to each node (ticks), and its parts.
    pub(super) images_sent: BTreeMap<u64, (u64, u64)>,
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
    /// What the next compaction of the log carries over, and when it is due.
    pub(super) kept: Kept,
}

/// A transaction's writes: each key once, `None` for a deletion.
pub(super) type Writes = Vec<(Key, Option<Vec<u8>>)>;

/// Mixes `v` into `h`: deterministic on every machine.
pub(super) fn mix(h: u64, v: u64) -> u64 {
    mix64(h ^ v.wrapping_mul(GOLDEN))
}

impl OssNode {
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
        for r in &records {
            self.kept.note(r);
        }
        out.push(Output::Persist(Write::Append(
            records.iter().map(|r| r.encode().into()).collect(),
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
        self.compact_if_due(out);
        Ok(())
    }
}
