//! The application's commits on an OSS node: local commits, commits sent to a sequencer, and
//! installing write sets once they are stable (see docs/design/oss.md).

use atomos_core::Key;
use atomos_seam::Output;

use super::msg::{AbortReason, OssDelivery, OssMsg, OssRecord};
use super::node::{LocalCommit, OssNode, Pending, Writes};
use super::sequencer::CommitRequest;
use super::vocabulary::{OssError, OssOutput};
use super::write_set::{DomainId, TxId};

impl OssNode {
    /// The application asks to commit: locally if it wrote no replicated key, else through
    /// its domain's sequencer.
    pub(super) fn commit(
        &mut self,
        caller: u64,
        reads: Vec<(Key, u64)>,
        writes: Writes,
        out: &mut Vec<OssOutput>,
    ) -> Result<(), OssError> {
        let abort = |reason| Output::Deliver(OssDelivery::Aborted { tx: caller, reason });
        if self.is_recovering() {
            self.counters.aborts += 1;
            out.push(abort(AbortReason::Recovering));
            return Ok(());
        }
        let mut domain: Option<DomainId> = None;
        let keys = reads
            .iter()
            .map(|(k, _)| k)
            .chain(writes.iter().map(|(k, _)| k));
        for key in keys {
            if self.is_local(key) {
                continue;
            }
            let d = self.domain_of(key);
            if domain.is_some_and(|x| x != d) {
                self.counters.aborts += 1;
                out.push(abort(AbortReason::CrossDomain));
                return Ok(());
            }
            domain = Some(d);
        }
        if let Some((key, _)) = reads.iter().find(|(k, v)| self.engine.version_of(k) != *v) {
            self.counters.aborts += 1;
            out.push(abort(AbortReason::Conflict(key.clone())));
            return Ok(());
        }
        let (local_writes, replicated): (Writes, Writes) =
            writes.into_iter().partition(|(k, _)| self.is_local(k));
        if let Some(key) = self.meets_pending(&reads, &local_writes) {
            self.counters.aborts += 1;
            out.push(abort(AbortReason::Conflict(key)));
            return Ok(());
        }
        let Some(domain) = domain.filter(|_| !replicated.is_empty()) else {
            // A local commit: durable first, installed once durable (incoming write sets
            // wait meanwhile, so nothing it read changes before).
            let applied = self.applied_marks();
            let record = OssRecord::Local {
                writes: local_writes.clone(),
                applied,
            };
            let write = self.persist(vec![record], out);
            self.local_queue.push(LocalCommit {
                write,
                caller,
                reads,
                writes: local_writes,
            });
            return Ok(());
        };
        let local_reads = reads
            .iter()
            .filter(|(k, _)| self.is_local(k))
            .map(|(k, _)| k.clone())
            .collect();
        let cid_reads = reads
            .into_iter()
            .filter(|(k, _)| !self.is_local(k))
            .map(|(k, _)| {
                let cid = self.key_cid.get(&k).copied().unwrap_or(0);
                (k, cid)
            })
            .collect();
        self.through_sequencer(
            Some(caller),
            domain,
            cid_reads,
            replicated,
            local_writes,
            local_reads,
            out,
        );
        Ok(())
    }

    /// A barrier: an empty commit through domain 0's sequencer.
    pub(super) fn barrier(&mut self, caller: u64, out: &mut Vec<OssOutput>) {
        self.through_sequencer(
            Some(caller),
            0,
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            out,
        );
    }

    /// Registers a commit that waits for its domain's sequencer, and sends it.
    #[allow(clippy::too_many_arguments)]
    fn through_sequencer(
        &mut self,
        caller: Option<u64>,
        domain: DomainId,
        reads: Vec<(Key, u64)>,
        writes: Writes,
        local_writes: Writes,
        local_reads: Vec<Key>,
        out: &mut Vec<OssOutput>,
    ) {
        self.next_tx += 1;
        let tx = TxId {
            node: self.cfg.id,
            run: self.run,
            n: self.next_tx,
        };
        let request = CommitRequest { tx, reads, writes };
        let epoch = self.domains[domain as usize].state.epoch;
        if !local_writes.is_empty() || !local_reads.is_empty() {
            let record = OssRecord::LocalOf {
                domain,
                epoch,
                request: request.clone(),
                writes: local_writes.clone(),
                local_reads: local_reads.clone(),
                applied: self.applied_marks(),
            };
            self.persist(vec![record], out);
        }
        let d = &self.domains[domain as usize];
        self.pending.insert(
            tx,
            Pending {
                caller,
                domain,
                request,
                local_writes,
                local_reads,
                epoch: d.state.epoch,
                sent_at: self.ticks,
                since: self.ticks,
                decided_through: None,
            },
        );
        self.send_commit(tx, out);
    }

    /// A key a new commit must not touch because a commit waiting here does: it reads one a
    /// waiting commit writes locally, or writes one a waiting commit read or writes locally.
    fn meets_pending(&self, reads: &[(Key, u64)], local_writes: &Writes) -> Option<Key> {
        let queued = self.local_queue.iter().flat_map(|l| l.writes.iter());
        let pending_writes = self.pending.values().flat_map(|p| p.local_writes.iter());
        let written: Vec<&Key> = queued.chain(pending_writes).map(|(k, _)| k).collect();
        if let Some((k, _)) = reads.iter().find(|(k, _)| written.contains(&k)) {
            return Some(k.clone());
        }
        let read: Vec<&Key> = self
            .pending
            .values()
            .flat_map(|p| p.local_reads.iter())
            .chain(
                self.local_queue
                    .iter()
                    .flat_map(|l| l.reads.iter().map(|(k, _)| k)),
            )
            .collect();
        local_writes
            .iter()
            .find(|(k, _)| read.contains(&k) || written.contains(&k))
            .map(|(k, _)| k.clone())
    }

    /// Sends waiting commit `tx` to its domain's sequencer (or numbers it here), unless its
    /// domain has no running epoch now or its fate waits on an epoch change.
    pub(super) fn send_commit(&mut self, tx: TxId, out: &mut Vec<OssOutput>) {
        let me = self.cfg.id;
        let ticks = self.ticks;
        let Some(p) = self.pending.get_mut(&tx) else {
            return;
        };
        let Some(d) = self.domains.get(p.domain as usize) else {
            return;
        };
        if d.state.epoch == 0 || d.state.suspected || p.decided_through.is_some() {
            return;
        }
        p.epoch = d.state.epoch;
        p.sent_at = ticks;
        let (domain, epoch, request, sequencer) =
            (p.domain, p.epoch, p.request.clone(), d.state.sequencer);
        if self.token_mode(domain) {
            // Numbered here with the token, once it is here and usable.
            if d.sequencer.is_some() {
                self.sequence(me, domain, epoch, request, out);
            } else {
                self.request_token(domain, out);
            }
        } else if sequencer == me {
            self.sequence(me, domain, epoch, request, out);
        } else {
            out.push(Output::Send {
                to: sequencer,
                msg: OssMsg::Commit {
                    domain,
                    epoch,
                    request,
                },
            });
        }
    }

    /// The sequencer of `epoch` refused waiting commit `tx` for a conflict: it aborts,
    /// unless the refusal is stale (the commit was sent again in a later epoch, or waits to
    /// learn what an epoch change made of it).
    pub(super) fn refused(&mut self, tx: TxId, epoch: u64, key: Key, out: &mut Vec<OssOutput>) {
        let current = self
            .pending
            .get(&tx)
            .is_some_and(|p| p.epoch == epoch && p.decided_through.is_none());
        if current {
            self.give_up(tx, AbortReason::Conflict(key), out);
        }
    }

    /// Waiting commit `tx` ends without committing here, for `reason`: it is never sent
    /// again (if it was logged to be sent after a restart, it is logged refused first), and
    /// its caller is answered.
    pub(super) fn give_up(&mut self, tx: TxId, reason: AbortReason, out: &mut Vec<OssOutput>) {
        let Some(p) = self.pending.remove(&tx) else {
            return;
        };
        if !p.local_writes.is_empty() || !p.local_reads.is_empty() {
            self.persist(vec![OssRecord::Refused(tx)], out);
        }
        if let Some(caller) = p.caller {
            self.counters.aborts += 1;
            out.push(Output::Deliver(OssDelivery::Aborted { tx: caller, reason }));
        }
    }

    /// Writes through number `through` are durable: local commits are installed and
    /// answered, held watermarks told, stable write sets installed.
    pub(super) fn on_durable(
        &mut self,
        through: u64,
        out: &mut Vec<OssOutput>,
    ) -> Result<(), OssError> {
        self.durable = self.durable.max(through);
        self.replica_durable(through, out)?;
        let done = self
            .local_queue
            .iter()
            .take_while(|l| l.write <= self.durable)
            .count();
        for l in self.local_queue.drain(..done).collect::<Vec<_>>() {
            self.position += 1;
            self.engine.apply_certified(self.position, &[], l.writes);
            self.counters.local_commits += 1;
            out.push(Output::Deliver(OssDelivery::Committed {
                tx: l.caller,
                version: self.position,
            }));
        }
        for i in 0..self.domains.len() {
            let d = &mut self.domains[i];
            if d.log.durable(self.durable) && d.log.counting() {
                let msg = OssMsg::Held {
                    domain: i as DomainId,
                    epoch: d.log.epoch(),
                    through: d.log.held(),
                };
                self.broadcast(msg, out);
            }
        }
        self.apply_stable(out);
        Ok(())
    }

    /// Each domain's applied watermark now.
    pub(super) fn applied_marks(&self) -> Vec<super::write_set::CommitId> {
        self.domains.iter().map(|d| d.log.applied()).collect()
    }

    /// Installs every write set now stable and here, in commit-id order (not while a local
    /// commit waits for its disk: it was validated against what is installed now).
    pub(super) fn apply_stable(&mut self, out: &mut Vec<OssOutput>) {
        if !self.local_queue.is_empty() {
            return;
        }
        for i in 0..self.domains.len() {
            self.install_durable_image(i, out);
            let ready = self.domains[i].log.take_applicable();
            if !ready.is_empty() {
                self.domains[i].progress_at = self.ticks;
            }
            for ws in ready {
                self.position += 1;
                let mut writes = ws.writes.clone();
                // Its own commit if the id and the writes match (an id of a run before a lost
                // disk could come back; its writes would not be these).
                let mine = match self.pending.get(&ws.tx) {
                    Some(p) if ws.tx.node == self.cfg.id && p.request.writes == ws.writes => {
                        self.pending.remove(&ws.tx)
                    }
                    _ => None,
                };
                if let Some(p) = &mine {
                    writes.extend(p.local_writes.iter().cloned());
                }
                self.engine.apply_certified(self.position, &[], writes);
                for (k, _) in &ws.writes {
                    self.key_cid.insert(k.clone(), ws.cid);
                }
                let d = &mut self.domains[i];
                for v in [ws.cid, ws.tx.node, ws.tx.run, ws.tx.n] {
                    d.digest = super::node::mix(d.digest, v);
                }
                self.counters.applied += 1;
                if let Some(caller) = mine.and_then(|p| p.caller) {
                    self.counters.commits += 1;
                    out.push(Output::Deliver(OssDelivery::Committed {
                        tx: caller,
                        version: self.position,
                    }));
                }
            }
            let d = &mut self.domains[i];
            let applied = d.log.applied();
            if let Some(s) = d.sequencer.as_mut() {
                s.applied_through(applied);
            }
            self.resolve_decided(i as DomainId, out);
            self.ready_sequencer(i as DomainId, out);
        }
    }
}
