//! Messages between OSS nodes: numbering commits as a domain's sequencer, spreading and
//! taking write sets, watermarks, fetching what was missed; and the node's timers.

use atomos_seam::Output;

use super::config::OssBug;
use super::domain_log::Offer;
use super::msg::{OssMsg, OssRecord};
use super::node::OssNode;
use super::sequencer::{CommitRequest, Sequencer};
use super::vocabulary::{OssError, OssOutput};
use super::write_set::{DomainId, Epoch, WriteSet};

/// The most write sets one fetch asks for.
const FETCH_MAX: u64 = 512;

impl OssNode {
    /// A message from another node (not the control log's).
    pub(super) fn on_message(
        &mut self,
        from: u64,
        msg: OssMsg,
        out: &mut Vec<OssOutput>,
    ) -> Result<(), OssError> {
        match msg {
            OssMsg::Order(_) => {}
            OssMsg::Commit {
                domain,
                epoch,
                request,
            } => self.sequence(from, domain, epoch, request, out),
            OssMsg::Refused {
                tx,
                epoch,
                conflict: Some(c),
                ..
            } => self.refused(tx, epoch, c.key, out),
            // Not the sequencer of that epoch: re-sent once the current one is known here.
            OssMsg::Refused { conflict: None, .. } => {}
            OssMsg::WriteSets(list) => self.take_write_sets(list, out),
            OssMsg::Held {
                domain,
                epoch,
                through,
            } => {
                if let Some(d) = self.domains.get_mut(domain as usize) {
                    d.log.peer_held(from, epoch, through);
                    self.apply_stable(out);
                }
            }
            OssMsg::Fetch {
                domain,
                from: first,
                to,
            } => {
                if self
                    .domains
                    .get(domain as usize)
                    .is_some_and(|d| d.log.forgot(first))
                {
                    self.send_image(from, domain, out);
                } else if let Some(d) = self.domains.get(domain as usize) {
                    let to = to.min(first.saturating_add(FETCH_MAX));
                    let known: Vec<WriteSet> = d
                        .log
                        .known(first, to)
                        .iter()
                        .map(|w| (**w).clone())
                        .collect();
                    if !known.is_empty() {
                        out.push(Output::Send {
                            to: from,
                            msg: OssMsg::WriteSets(known),
                        });
                    }
                }
            }
            OssMsg::Report {
                domain,
                epoch,
                mark,
            } => self.on_report(from, domain, epoch, mark, out)?,
            OssMsg::Token(token) => self.on_token(from, token, out),
            OssMsg::TokenAck { domain, epoch, hop } => self.on_token_ack(domain, epoch, hop),
            OssMsg::TokenRequest {
                domain,
                epoch,
                node,
                forwarded,
            } => self.on_token_request(domain, epoch, node, forwarded, out),
            OssMsg::ImagePart(part) => self.take_image_part(from, part, out),
            OssMsg::RejoinProbe { run } => out.push(Output::Send {
                to: from,
                msg: OssMsg::RejoinAnswer {
                    run,
                    rejoining: self.rejoining,
                    held: self.domains.iter().map(|d| d.log.held()).collect(),
                },
            }),
            OssMsg::RejoinAnswer {
                run,
                rejoining,
                held,
            } => {
                // Only this run's probe counts, answered by a member that did not lose its
                // log; its first answer is enough (a later one only moves the target).
                let member = from != self.cfg.id && self.cfg.members.contains(&from);
                if self.rejoining && run == self.run && !rejoining && member {
                    self.rejoin_answers.entry(from).or_insert(held);
                }
            }
        }
        Ok(())
    }

    /// A commit request from node `from` (this node too) for `domain` in `epoch`.
    pub(super) fn sequence(
        &mut self,
        from: u64,
        domain: DomainId,
        epoch: Epoch,
        request: CommitRequest,
        out: &mut Vec<OssOutput>,
    ) {
        let me = self.cfg.id;
        let token_mode = self.token_mode(domain);
        let Some(d) = self.domains.get_mut(domain as usize) else {
            return;
        };
        // In a token mode a node numbers its own commits alone, with the token.
        let numbers_here = if token_mode {
            from == me && d.token.held.is_some()
        } else {
            d.state.sequencer == me
        };
        let current = d.state.epoch == epoch && numbers_here && !d.state.suspected;
        if !current || d.orphaned {
            if from != me && !d.state.suspected && !token_mode {
                out.push(Output::Send {
                    to: from,
                    msg: OssMsg::Refused {
                        domain,
                        epoch,
                        tx: request.tx,
                        conflict: None,
                    },
                });
            }
            return;
        }
        if d.numbered.contains(&request.tx) {
            return;
        }
        let Some(seq) = d.sequencer.as_mut() else {
            if !token_mode {
                d.waiting.push((from, request));
            }
            return;
        };
        let key_cid = &self.key_cid;
        let tx = request.tx;
        let mut request = request;
        if self.cfg.planted_bug == Some(OssBug::SkipValidation) {
            request.reads.clear();
        }
        match seq.number(request, |k| key_cid.get(k).copied().unwrap_or(0)) {
            Ok(ws) => {
                d.numbered.insert(tx);
                d.outbox.push(ws);
                self.counters.numbered += 1;
            }
            Err(conflict) if from == me => self.refused(tx, epoch, conflict.key, out),
            Err(conflict) => out.push(Output::Send {
                to: from,
                msg: OssMsg::Refused {
                    domain,
                    epoch,
                    tx,
                    conflict: Some(conflict),
                },
            }),
        }
    }

    /// Becomes the sequencer of `domain`'s epoch once this node applied every id below its
    /// first, then numbers the requests that waited.
    pub(super) fn ready_sequencer(&mut self, domain: DomainId, out: &mut Vec<OssOutput>) {
        if self.token_mode(domain) {
            return self.ready_token(domain, out);
        }
        let me = self.cfg.id;
        let Some(d) = self.domains.get_mut(domain as usize) else {
            return;
        };
        let s = d.state;
        let ready = s.epoch > 0
            && s.sequencer == me
            && !s.suspected
            && !d.orphaned
            && d.sequencer.is_none()
            && d.log.counting()
            && d.log.applied() + 1 >= s.first;
        if !ready {
            return;
        }
        // Nothing of this epoch exists yet but what this node numbered (it never restarted
        // in it): numbering continues after the highest id here.
        let next = s.first.max(d.log.highest_received() + 1);
        d.sequencer = Some(Sequencer::new(domain, s.epoch, next, d.log.unapplied()));
        for (from, request) in std::mem::take(&mut d.waiting) {
            self.sequence(from, domain, s.epoch, request, out);
        }
    }

    /// Write sets from a sequencer or a fetch: each new one is persisted, and counts once
    /// durable.
    fn take_write_sets(&mut self, list: Vec<WriteSet>, out: &mut Vec<OssOutput>) {
        let write = self.writes + 1;
        let mut records = Vec::new();
        for ws in list {
            let Some(d) = self.domains.get_mut(ws.domain as usize) else {
                continue;
            };
            // Owner prediction: the newest commit's node had the token last.
            if d.token.held.is_none() && ws.cid > d.log.highest_received() {
                d.token.hint = ws.tx.node;
            }
            let record = OssRecord::WriteSet(ws.clone());
            if d.log.offer(ws, write) == Offer::Persist {
                records.push(record);
            }
        }
        if !records.is_empty() {
            self.persist(records, out);
        }
        // Those installable already (decided by an epoch start, stable and durable) go in.
        self.apply_stable(out);
    }

    /// After every step: what a sequencer numbered goes to every node, itself included.
    pub(super) fn after_step(&mut self, out: &mut Vec<OssOutput>) -> Result<(), OssError> {
        // Taking its own write sets may install some and let waiting requests be numbered.
        while let Some(i) = self.domains.iter().position(|d| !d.outbox.is_empty()) {
            let numbered = std::mem::take(&mut self.domains[i].outbox);
            // Its own copies first: persisted before the others can count them anywhere.
            self.take_write_sets(numbered.clone(), out);
            self.broadcast(OssMsg::WriteSets(numbered), out);
        }
        self.release_tokens(out);
        Ok(())
    }

    /// Per tick: fetch what is missing, tell held watermarks again, re-send unanswered
    /// commits, and the epochs' timers.
    pub(super) fn on_tick(&mut self, out: &mut Vec<OssOutput>) -> Result<(), OssError> {
        let ticks = self.ticks;
        let others: Vec<u64> = self
            .cfg
            .members
            .iter()
            .copied()
            .filter(|&m| m != self.cfg.id)
            .collect();
        for i in 0..self.domains.len() {
            let domain = i as DomainId;
            let d = &mut self.domains[i];
            let gaps = d.log.missing();
            if gaps.is_empty() {
                d.gap_since = None;
            } else {
                let since = *d.gap_since.get_or_insert(ticks);
                if ticks >= since + self.cfg.gap_after && !others.is_empty() {
                    d.gap_since = Some(ticks);
                    let to = others
                        [(ticks as usize / self.cfg.gap_after.max(1) as usize) % others.len()];
                    for (from, last) in gaps {
                        out.push(Output::Send {
                            to,
                            msg: OssMsg::Fetch {
                                domain,
                                from,
                                to: last.min(from + FETCH_MAX),
                            },
                        });
                        self.counters.fetches += 1;
                    }
                }
            }
            if ticks.is_multiple_of(self.cfg.held_every.max(1)) && d.log.counting() {
                let msg = OssMsg::Held {
                    domain,
                    epoch: d.log.epoch(),
                    through: d.log.held(),
                };
                self.broadcast(msg, out);
            }
        }
        if self.rejoining && ticks.is_multiple_of(self.cfg.held_every.max(1)) {
            self.broadcast(OssMsg::RejoinProbe { run: self.run }, out);
        }
        let late: Vec<_> = self
            .pending
            .iter()
            .filter(|(_, p)| {
                p.decided_through.is_none() && ticks >= p.sent_at + self.cfg.resend_after
            })
            .map(|(tx, _)| *tx)
            .collect();
        for tx in late {
            self.send_commit(tx, out);
        }
        self.token_tick(out);
        self.epoch_tick(out)
    }
}
