//! An OSS node's start: rebuilding its domains' logs, its node-local objects and its control
//! replica from the records its disk kept; and, after it lost its disk, when it has caught up
//! with the others (until then it reports no marks).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use atomos_core::Engine;
use atomos_order::{decode_log, Endpoint, EndpointConfig, Replica};
use rustc_hash::{FxHashMap, FxHashSet};

use super::config::{CommitMode, OssBug, OssConfig};
use super::control::{Control, DomainState};
use super::domain_log::DomainLog;
use super::msg::OssRecord;
use super::node::{mix, DomainNode, OssNode, Pending};
use super::token_state::TokenState;
use super::vocabulary::{OssCounters, OssError, OssOutput};
use super::write_set::CommitId;

/// A run's id, mixed from the configuration's seed and the incarnation.
fn run_id(seed: u64, incarnation: u64) -> u64 {
    mix(seed, incarnation)
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
        let replica = Replica::open(cfg.replica.clone(), decode_log(order)?, Control::new())?;
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
                image: None,
                assembly: BTreeMap::new(),
                images_sent: BTreeMap::new(),
            })
            .collect();
        let run = run_id(cfg.replica.seed, incarnation);
        let endpoint_cfg = EndpointConfig {
            // The run's id, so a restarted node's client never reuses an earlier one's ids.
            client_base: run & !0xFFFF_FFFF,
            resend_ticks: cfg.resend_after.max(1) * 2,
            request_lifetime_ms: atomos_order::REQUEST_LIFETIME_MS,
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
            kept: Default::default(),
        };
        node.replay(decoded);
        Ok(node)
    }

    /// Rebuilds the domains' logs and the node-local objects from the records, in order.
    fn replay(&mut self, records: Vec<OssRecord>) {
        for r in records {
            self.kept.note(&r);
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
                OssRecord::Image(image) => {
                    // Installed where it stood: durable, ahead of what came before it.
                    if let Some(d) = self.domains.get_mut(image.domain as usize) {
                        d.image = Some((0, image));
                        let mut ignored = Vec::new();
                        self.apply_stable(&mut ignored);
                    }
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
    pub(super) fn check_rejoined(&mut self, out: &mut Vec<OssOutput>) {
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
}
