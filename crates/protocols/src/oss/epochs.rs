//! The control log on an OSS node: its order endpoint (the replica and this node's client,
//! one proposal in flight at a time), and what the node does when an epoch is suspected or
//! starts (see docs/design/oss.md, "Epochs through the order layer").

use atomos_order::{EndpointDelivery, EndpointRequest, OrderMsg};
use atomos_seam::{Input, Machine, Output, Write};

use super::control::{ControlEntry, ControlEvent, DomainState};
use super::msg::{OssMsg, OssRecord};
use super::node::OssNode;
use super::vocabulary::{OssError, OssOutput};
use super::write_set::{CommitId, DomainId, Epoch};

impl OssNode {
    /// Steps the control log's endpoint (its replica and this node's client) with `input` and
    /// carries out what follows, then acts on what the control log applied.
    pub(super) fn control_step(
        &mut self,
        input: Input<OrderMsg, EndpointRequest>,
        out: &mut Vec<OssOutput>,
    ) -> Result<(), OssError> {
        let mut next = Some(input);
        while let Some(input) = next.take() {
            let mut actions = Vec::new();
            self.endpoint.step(self.ticks, input, &mut actions)?;
            for action in actions {
                self.carry_one(action, out)?;
            }
            // The proposal in flight was answered: the next one waiting goes.
            if self.proposing.is_none() {
                next = self.next_proposal();
            }
        }
        self.control_events(out)
    }

    /// The next proposal waiting, as the endpoint's submission (it is then in flight).
    fn next_proposal(&mut self) -> Option<Input<OrderMsg, EndpointRequest>> {
        let entry = self.proposals_waiting.pop_front()?;
        self.proposals += 1;
        let ticket = self.proposals;
        let payload = entry.encode();
        self.proposing = Some((ticket, entry));
        // Control entries never expire: an epoch change must land however long it takes.
        Some(Input::Request(EndpointRequest::Submit {
            ticket,
            payload,
            deadline_ms: atomos_order::NO_DEADLINE,
        }))
    }

    /// This node's writes through `through` are durable: the control replica hears how far
    /// its own are (it applies nothing its disk does not hold).
    pub(super) fn replica_durable(
        &mut self,
        through: u64,
        out: &mut Vec<OssOutput>,
    ) -> Result<(), OssError> {
        let mut replica_through = None;
        while let Some(&(write, replica_write)) = self.replica_unsynced.front() {
            if write > through {
                break;
            }
            self.replica_unsynced.pop_front();
            replica_through = Some(replica_write);
        }
        match replica_through {
            Some(through) => self.control_step(Input::Persisted { through }, out),
            None => Ok(()),
        }
    }

    /// Orders `entry` in the control log. One proposal is in flight at a time (one client's
    /// worth of re-sends, however long the control log cannot order); the others wait, and an
    /// entry already waiting or in flight is not proposed twice.
    pub(super) fn propose(
        &mut self,
        entry: ControlEntry,
        out: &mut Vec<OssOutput>,
    ) -> Result<(), OssError> {
        let in_flight = self.proposing.as_ref().is_some_and(|(_, e)| *e == entry);
        if in_flight || self.proposals_waiting.contains(&entry) {
            return Ok(());
        }
        self.proposals_waiting.push_back(entry);
        match self.proposing {
            Some(_) => Ok(()),
            None => match self.next_proposal() {
                Some(submit) => self.control_step(submit, out),
                None => Ok(()),
            },
        }
    }

    /// One output of the replica that leaves this node (or its disk).
    fn carry_one(
        &mut self,
        action: Output<OrderMsg, EndpointDelivery>,
        out: &mut Vec<OssOutput>,
    ) -> Result<(), OssError> {
        match action {
            Output::Send { to, msg } => out.push(Output::Send {
                to,
                msg: OssMsg::Order(msg),
            }),
            Output::Persist(Write::Append(records)) => {
                let write = self.persist(
                    records
                        .into_iter()
                        .map(|r| OssRecord::Order(r.to_vec()))
                        .collect(),
                    out,
                );
                self.replica_writes += 1;
                self.replica_unsynced
                    .push_back((write, self.replica_writes));
            }
            Output::Persist(Write::Rewrite(_) | Write::Compact(_)) => {
                return Err(OssError::Unsupported("rewrite its log"))
            }
            Output::Warn(text) => out.push(Output::Warn(text)),
            // The proposal in flight was ordered: the next may go.
            Output::Deliver(EndpointDelivery::Answered { ticket, .. })
                if self.proposing.as_ref().is_some_and(|(t, _)| *t == ticket) =>
            {
                self.proposing = None
            }
            // The control log acts through its events.
            Output::Deliver(_) => {}
        }
        Ok(())
    }

    /// Acts on the control entries applied since the last call.
    fn control_events(&mut self, out: &mut Vec<OssOutput>) -> Result<(), OssError> {
        let events = self.endpoint.replica_mut().machine_mut().take_events();
        for e in events {
            match e {
                ControlEvent::Suspected { domain, epoch } => self.fenced(domain, epoch, out),
                ControlEvent::Started { domain, state } => self.started(domain, state, out),
            }
        }
        Ok(())
    }

    /// The control log suspected `epoch` of `domain`: take no more of its write sets and tell
    /// everyone how far this node holds them.
    fn fenced(&mut self, domain: DomainId, epoch: Epoch, out: &mut Vec<OssOutput>) {
        let me = self.cfg.id;
        let Some(d) = self.domains.get_mut(domain as usize) else {
            return;
        };
        let Some(mark) = d.log.fence(epoch) else {
            return;
        };
        d.state.suspected = true;
        d.sequencer = None;
        // A token of the suspected epoch is dead.
        d.token.held = None;
        d.token.passed = None;
        d.waiting.clear();
        d.outbox.clear();
        self.persist(vec![OssRecord::Fenced { domain, epoch }], out);
        if self.rejoining {
            // What it held before it lost its log is unknown: it reports nothing.
            return;
        }
        if let Some(d) = self.domains.get_mut(domain as usize) {
            d.reports.insert(me, mark);
        }
        self.broadcast(
            OssMsg::Report {
                domain,
                epoch,
                mark,
            },
            out,
        );
    }

    /// The control log started a new epoch of `domain`.
    fn started(&mut self, domain: DomainId, state: DomainState, out: &mut Vec<OssOutput>) {
        let ticks = self.ticks;
        let Some(d) = self.domains.get_mut(domain as usize) else {
            return;
        };
        let dropped = d.log.start(state.epoch, state.first);
        if d.log.epoch() != state.epoch || d.state.epoch == state.epoch {
            return;
        }
        d.state = state;
        d.sequencer = None;
        // A node that lost its log may be replaying a start it once sequenced from: it never
        // sequences an epoch that started before it caught up.
        d.orphaned = self.rejoining;
        d.waiting.clear();
        d.numbered.clear();
        d.reports.clear();
        d.progress_at = ticks;
        d.proposed_at = None;
        self.counters.epochs += 1;
        // What the start dropped will never be installed: recovery waits for no more.
        if let Some(mark) = self.recovering.get_mut(domain as usize) {
            *mark = (*mark).min(state.first - 1);
        }
        self.persist(vec![OssRecord::Started { domain, state }], out);
        if state.epoch == 1 && state.mode != self.cfg.commit {
            out.push(Output::Warn(format!(
                "domain {domain} numbers its commits {} as the cluster agreed, not {} as this \
                 node is configured",
                state.mode.name(),
                self.cfg.commit.name()
            )));
        }
        self.token_started(domain, state.sequencer, state.first, out);
        // Commits sent in an earlier epoch: committed if their write set is among the ids the
        // start kept, else sent again in this epoch (once this node applied that far).
        let me = self.cfg.id;
        for tx in dropped {
            if tx.node == me {
                if let Some(p) = self.pending.get_mut(&tx) {
                    p.decided_through = Some(state.first - 1);
                }
            }
        }
        for p in self.pending.values_mut() {
            if p.domain == domain && p.epoch < state.epoch {
                p.decided_through = Some(state.first - 1);
            }
        }
        self.resolve_decided(domain, out);
    }

    /// A node's report of a suspected epoch; with a majority of them, order the next start.
    pub(super) fn on_report(
        &mut self,
        from: u64,
        domain: DomainId,
        epoch: Epoch,
        mark: CommitId,
        out: &mut Vec<OssOutput>,
    ) -> Result<(), OssError> {
        let majority = self.majority();
        let Some(d) = self.domains.get_mut(domain as usize) else {
            return Ok(());
        };
        if d.state.epoch != epoch || !d.state.suspected {
            return Ok(());
        }
        d.reports.insert(from, mark);
        if d.reports.len() < majority {
            return Ok(());
        }
        let max = d.reports.values().copied().max().unwrap_or(0);
        // The first node (by id) that holds everything through the maximum sequences next:
        // it needs to fetch nothing before it starts.
        let sequencer = d
            .reports
            .iter()
            .find(|(_, m)| **m == max)
            .map_or(self.cfg.id, |(n, _)| *n);
        if d.proposed_at
            .is_some_and(|t| self.ticks < t + self.cfg.resend_after)
        {
            return Ok(());
        }
        d.proposed_at = Some(self.ticks);
        let mode = d.state.mode;
        self.propose(
            ControlEntry::Start {
                domain,
                epoch: epoch + 1,
                sequencer,
                first: max + 1,
                mode,
            },
            out,
        )
    }

    /// Per tick: start the first epochs, suspect epochs that make no progress, tell reports
    /// again while a suspicion waits for its start.
    pub(super) fn epoch_tick(&mut self, out: &mut Vec<OssOutput>) -> Result<(), OssError> {
        let first_sequencer = self
            .cfg
            .members
            .iter()
            .copied()
            .min()
            .unwrap_or(self.cfg.id);
        for i in 0..self.domains.len() {
            let domain = i as DomainId;
            let d = &self.domains[i];
            let due = d
                .proposed_at
                .is_none_or(|t| self.ticks >= t + self.cfg.suspect_after);
            if d.state.epoch == 0 {
                if due {
                    self.domains[i].proposed_at = Some(self.ticks);
                    self.propose(
                        ControlEntry::Start {
                            domain,
                            epoch: 1,
                            sequencer: first_sequencer,
                            first: 1,
                            mode: self.cfg.commit,
                        },
                        out,
                    )?;
                }
                continue;
            }
            if d.state.suspected {
                if self.ticks.is_multiple_of(self.cfg.held_every.max(1)) {
                    if let Some(&mark) = d.reports.get(&self.cfg.id) {
                        let epoch = d.state.epoch;
                        self.broadcast(
                            OssMsg::Report {
                                domain,
                                epoch,
                                mark,
                            },
                            out,
                        );
                        // Its own report counts as the others' do: in a cluster of one it is
                        // the majority, and nobody else's report would order the start.
                        self.on_report(self.cfg.id, domain, epoch, mark, out)?;
                    }
                }
                continue;
            }
            let stalled = self.ticks >= d.progress_at + self.cfg.suspect_after;
            let waiting = self
                .pending
                .values()
                .any(|p| p.domain == domain && self.ticks >= p.since + self.cfg.suspect_after);
            // A sequencer that restarted never resumes its epoch: the next one starts fresh.
            // In a token mode, nor does a node that may have held the token (once it no
            // longer rejoins).
            let orphaned = d.orphaned
                && if self.token_mode(domain) {
                    !self.rejoining
                } else {
                    d.state.sequencer == self.cfg.id
                };
            if due && ((stalled && waiting) || orphaned) {
                let epoch = d.state.epoch;
                self.domains[i].proposed_at = Some(self.ticks);
                self.counters.suspicions += 1;
                self.propose(ControlEntry::Suspect { domain, epoch }, out)?;
            }
        }
        Ok(())
    }

    /// Commits whose epoch changed: once this node applied every id the start kept, the ones
    /// not among them are sent again in the new epoch.
    pub(super) fn resolve_decided(&mut self, domain: DomainId, out: &mut Vec<OssOutput>) {
        let Some(d) = self.domains.get(domain as usize) else {
            return;
        };
        if !d.log.counting() || d.state.suspected {
            // The next start decides again.
            return;
        }
        let applied = d.log.applied();
        let ready: Vec<_> = self
            .pending
            .iter()
            .filter(|(_, p)| p.domain == domain && p.decided_through.is_some_and(|t| t <= applied))
            .map(|(tx, _)| *tx)
            .collect();
        for tx in ready {
            if let Some(p) = self.pending.get_mut(&tx) {
                p.decided_through = None;
            }
            self.send_commit(tx, out);
        }
    }
}
