//! The replica's task: it steps the endpoint (the replica with this node's clients) on ticks,
//! peers' messages, local submissions and disk confirmations, carries out what it asks, and
//! hands each answer to whoever waits for its ticket (an application, or generated load).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use atomos_net::transport::Transport;
use atomos_order::{
    Addr, ChangeRefused, Delivery, Endpoint, EndpointDelivery, EndpointRequest, OrderError,
    OrderMsg, Outcome, StateMachine,
};
use atomos_seam::Input;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::disk::DiskEvent;
use crate::driver::{Carry, RunError, Runner};

use super::{
    Answer, Event, LoadHooks, MembershipHook, OrderNodeConfig, OrderNodeError, Reply, Shared,
    MACHINE_COUNTERS_EVERY,
};

/// Who waits for a submission's answer.
enum Waiter {
    /// An application's `submit`.
    App(Reply),
    /// Nobody: generated load, with its payload.
    Load(Vec<u8>),
}

/// The submissions in flight, by ticket, and the generated load.
pub(super) struct Waiters {
    next_ticket: u64,
    waiting: BTreeMap<u64, Waiter>,
    load_payload: Vec<u8>,
    hooks: Option<LoadHooks>,
    generated: u64,
    /// Generated requests answered, whose successors are not submitted yet.
    load_due: usize,
}

impl Waiters {
    pub(super) fn new(cfg: &OrderNodeConfig) -> Waiters {
        Waiters {
            next_ticket: 1,
            waiting: BTreeMap::new(),
            load_payload: vec![7; cfg.load_request_bytes],
            hooks: cfg.load_hooks.clone(),
            generated: 0,
            load_due: cfg.load_clients,
        }
    }

    /// A ticket for a submission `waiter` waits for.
    fn add(&mut self, waiter: Waiter) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.waiting.insert(ticket, waiter);
        ticket
    }

    /// A ticket for a membership change (numbered with the submissions, so none is shared).
    fn add_change(&mut self) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        ticket
    }

    fn next_load(&mut self) -> Vec<u8> {
        self.generated += 1;
        match &self.hooks {
            Some(h) => (h.payload)(self.generated - 1),
            None => self.load_payload.clone(),
        }
    }

    /// Submission `ticket` ended: its waiter hears of it (generated load: the next request is
    /// due).
    fn answered(&mut self, ticket: u64, outcome: Outcome, shared: &Shared) {
        match self.waiting.remove(&ticket) {
            Some(Waiter::App(reply)) => reply.send(match outcome {
                Outcome::Applied(response) => Answer::Applied(response),
                Outcome::Expired => Answer::Expired,
                Outcome::Unknown => Answer::Forgotten,
            }),
            Some(Waiter::Load(payload)) => {
                if let Some(h) = &self.hooks {
                    (h.answered)(&payload);
                }
                self.load_due += 1;
                shared.load_answered.fetch_add(1, Ordering::Relaxed);
            }
            None => {}
        }
    }
}

/// The replica's task: the endpoint (the replica and this node's clients) in its runner
/// (time, disk, gate) and everything else.
pub(super) struct Task<S: StateMachine> {
    pub(super) runner: Runner<Endpoint<S>>,
    pub(super) io: OrderIo,
}

/// Where the endpoint's outputs go, and who waits for its answers.
pub(super) struct OrderIo {
    pub(super) me: Addr,
    pub(super) transport: Arc<dyn Transport<OrderMsg>>,
    pub(super) shared: Arc<Shared>,
    pub(super) waiters: Waiters,
    /// Membership changes asked for, by ticket, with who waits for the leader's answer.
    pub(super) changes: BTreeMap<u64, oneshot::Sender<Result<u64, ChangeRefused>>>,
    pub(super) on_membership: Option<MembershipHook>,
    pub(super) opt_at: BTreeMap<u64, Instant>,
    /// When the state machine's counters are published next.
    pub(super) counters_due: Instant,
    /// When each peer's refused sends were last reported in the log.
    pub(super) reported: super::refused_sends::Reported,
    /// The task's own inbox: a snapshot encoded on a thread of its own comes back through it.
    pub(super) events: mpsc::UnboundedSender<Event>,
    /// Who waits for a snapshot covering a position (see [`Task::serve_snapshots`]).
    pub(super) snapshots: Vec<(u64, oneshot::Sender<atomos_order::SnapshotCopy>)>,
}

impl OrderIo {
    /// Runs the job encoding the state at `seq` on a background thread of its own (the
    /// replica's task goes on applying: the state is pinned), and hands the bytes back to the
    /// task.
    fn encode_snapshot(&self, seq: u64, job: atomos_order::SnapshotJob) {
        let events = self.events.clone();
        let answer = events.clone();
        let me = self.me;
        let spawned = crate::background::spawn(format!("snapshot-{me}"), move || {
            let started = Instant::now();
            // A job that panics (a value whose encoding panics) answers empty bytes: the
            // replica then asks again later, rather than waiting for it forever.
            let state =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).unwrap_or_default();
            info!(
                node = me,
                seq,
                bytes = state.len(),
                ms = started.elapsed().as_millis() as u64,
                "snapshot encoded"
            );
            let _ = answer.send(Event::SnapshotEncoded { seq, state });
        });
        if let Err(e) = spawned {
            warn!(node = self.me, seq, "no thread to encode a snapshot: {e}");
            let _ = events.send(Event::SnapshotEncoded {
                seq,
                state: Vec::new(),
            });
        }
    }
}

impl<S: StateMachine> Carry<Endpoint<S>> for OrderIo {
    /// The endpoint keeps this node's messages to itself: everything sent here is for others.
    fn send(&mut self, to: Addr, msg: OrderMsg) {
        let what = super::refused_sends::describe(&msg);
        if let Err(e) = self.transport.send(to, msg) {
            self.shared
                .refused
                .refused(&mut self.reported, to, what, &e);
        }
    }

    fn deliver(&mut self, d: EndpointDelivery) {
        let d = match d {
            EndpointDelivery::Answered {
                ticket, outcome, ..
            } => return self.waiters.answered(ticket, outcome, &self.shared),
            EndpointDelivery::Order(d) => d,
        };
        let shared = &self.shared;
        match &d {
            Delivery::EncodeSnapshot { seq, job } => {
                if let Some(job) = job.take() {
                    self.encode_snapshot(*seq, job);
                }
            }
            Delivery::Opt { seq, .. } => {
                self.opt_at.insert(*seq, Instant::now());
                shared.opt_delivered.fetch_add(1, Ordering::Relaxed);
                shared.metrics.opt_delivered.increment(1);
            }
            Delivery::Final { seq, .. } => {
                if let Some(at) = self.opt_at.remove(seq) {
                    let delay = at.elapsed();
                    shared.metrics.opt_to_final.record(delay.as_secs_f64());
                    let _ = shared.opt_to_final.lock().record(delay.as_nanos() as u64);
                }
            }
            Delivery::Revoke { from } => {
                let gone = self.opt_at.split_off(from);
                shared
                    .revoked
                    .fetch_add(gone.len() as u64, Ordering::Relaxed);
                shared.metrics.revoked.increment(gone.len() as u64);
            }
            Delivery::Installed { seq } => {
                self.opt_at = self.opt_at.split_off(&(seq + 1));
            }
            Delivery::Membership { seq, membership } => {
                tracing::info!(
                    node = self.me,
                    seq,
                    voters = ?membership.voters,
                    learners = ?membership.learners,
                    outgoing = ?membership.outgoing,
                    "membership in force"
                );
                let before = std::mem::replace(&mut *shared.membership.lock(), membership.clone());
                if let Some(hook) = &self.on_membership {
                    (hook.0)(Some(&before), membership);
                }
            }
            Delivery::MemberChange { ticket, result } => {
                if let Some(reply) = self.changes.remove(ticket) {
                    let _ = reply.send(result.clone());
                }
            }
            Delivery::Alarm { seq, text } => {
                tracing::error!(node = self.me, seq, "{text}");
                metrics::counter!("atomos_replica_alarms_total").increment(1);
            }
        }
        if let Some(tx) = shared.deliveries.lock().as_ref() {
            let _ = tx.send(d);
        }
    }

    fn warn(&mut self, text: String) {
        warn!(node = self.me, "{text}");
    }
}

impl From<RunError<OrderError>> for OrderNodeError {
    fn from(e: RunError<OrderError>) -> Self {
        match e {
            RunError::Machine(e) => OrderNodeError::Order(e),
            RunError::DiskStopped(why) => OrderNodeError::Io(std::io::Error::other(why)),
        }
    }
}

impl<S: StateMachine> Task<S> {
    /// Steps the endpoint; returns how many outputs it produced.
    fn step(&mut self, input: Input<OrderMsg, EndpointRequest>) -> Result<usize, OrderNodeError> {
        Ok(self.runner.step(input, &mut self.io)?)
    }

    fn on_event(&mut self, e: Event) -> Result<(), OrderNodeError> {
        match e {
            Event::Net { from, msg } => {
                self.step(Input::Message { from, msg })?;
            }
            Event::Submit {
                payload,
                deadline_ms,
                reply,
            } => {
                let ticket = self.io.waiters.add(Waiter::App(reply));
                self.submit(ticket, payload, deadline_ms)?;
            }
            Event::Disk(DiskEvent::Durable { through, .. }) => {
                self.runner.durable(through, &mut self.io)?;
            }
            Event::Disk(DiskEvent::Failed(e)) => return Err(e.into()),
            Event::SnapshotEncoded { seq, state } => {
                self.step(Input::Request(EndpointRequest::SnapshotEncoded {
                    seq,
                    state,
                }))?;
            }
            Event::ChangeMembership { change, reply } => {
                let ticket = self.io.waiters.add_change();
                self.io.changes.insert(ticket, reply);
                self.step(Input::Request(EndpointRequest::ChangeMembership {
                    ticket,
                    change,
                }))?;
            }
            Event::Snapshot { after, reply } => {
                self.io.snapshots.push((after, reply));
                self.serve_snapshots()?;
            }
        }
        Ok(())
    }

    /// Hands out the latest snapshot to those waiting for one that covers their position
    /// (a waiter that gave up is dropped), and asks the replica for a new one while a waiter's
    /// position is delivered here and the latest snapshot does not cover it.
    fn serve_snapshots(&mut self) -> Result<(), OrderNodeError> {
        if self.io.snapshots.is_empty() {
            return Ok(());
        }
        let replica = self.runner.machine().replica();
        let latest = replica.snapshot_copy();
        let applied = replica.final_next() - 1;
        let mut wanted = false;
        let waiting = std::mem::take(&mut self.io.snapshots);
        for (after, reply) in waiting {
            match &latest {
                _ if reply.is_closed() => {}
                Some(copy) if copy.index >= after => {
                    let _ = reply.send(copy.clone());
                }
                _ => {
                    wanted |= applied >= after;
                    self.io.snapshots.push((after, reply));
                }
            }
        }
        if wanted {
            self.step(Input::Request(EndpointRequest::SnapshotNow))?;
        }
        Ok(())
    }

    fn submit(
        &mut self,
        ticket: u64,
        payload: Vec<u8>,
        deadline_ms: u64,
    ) -> Result<usize, OrderNodeError> {
        let submit = EndpointRequest::Submit {
            ticket,
            payload,
            deadline_ms,
        };
        self.step(Input::Request(submit))
    }

    /// Generated load whose predecessors were answered: its next requests, without deadline
    /// (every request of it is answered). Returns the outputs produced.
    fn submit_load(&mut self) -> Result<usize, OrderNodeError> {
        let mut produced = 0;
        while self.io.waiters.load_due > 0 {
            self.io.waiters.load_due -= 1;
            let payload = self.io.waiters.next_load();
            let ticket = self.io.waiters.add(Waiter::Load(payload.clone()));
            produced += self.submit(ticket, payload, atomos_order::NO_DEADLINE)?;
        }
        Ok(produced)
    }

    /// Local work: generated load submitted, the open batch sealed. Returns whether the
    /// endpoint produced anything.
    async fn round(&mut self) -> Result<bool, OrderNodeError> {
        self.serve_snapshots()?;
        let mut produced = self.submit_load()?;
        produced += self.step(Input::Request(EndpointRequest::Flush))?;
        produced += self.runner.release(&mut self.io)?;
        // Backpressure: wait while the disk thread cannot take more writes.
        self.runner.drain_backlog().await?;
        let replica = self.runner.machine().replica();
        self.io
            .shared
            .requests_delivered
            .store(replica.stats().requests_delivered, Ordering::Relaxed);
        let now = Instant::now();
        if now >= self.io.counters_due {
            self.io.counters_due = now + MACHINE_COUNTERS_EVERY;
            let counters = replica.machine().counters();
            self.io.shared.publish_machine(self.io.me, counters);
            let (batches, _) = replica.remembered_batches();
            *self.io.shared.kept.lock() = super::Kept {
                snapshot_bytes: replica.snapshot_bytes() as u64,
                sessions: replica.sessions() as u64,
                batches: batches as u64,
            };
            publish_replica(self.io.me, replica);
        }
        Ok(produced > 0)
    }
}

/// What the replica's task reads: local requests and the disk's reports (unbounded: they are
/// few and must not be lost), and messages from the network (bounded).
pub(super) struct Inbox {
    pub(super) ctl: mpsc::UnboundedReceiver<Event>,
    pub(super) net: mpsc::Receiver<Event>,
    /// Keeps the network inbox open while the task runs, whatever the transport does.
    pub(super) _net_open: mpsc::Sender<Event>,
}

impl Inbox {
    /// The next event waiting, local ones first, without waiting.
    fn try_next(&mut self) -> Option<Event> {
        self.ctl
            .try_recv()
            .ok()
            .or_else(|| self.net.try_recv().ok())
    }
}

/// Runs the replica's task, then lets its disk thread finish (or stop, if abandoned) before the
/// task ends, so nothing is written to its log after [`OrderNode::stop`](super::OrderNode::stop)
/// returns.
pub(super) async fn run<S: StateMachine>(
    cfg: OrderNodeConfig,
    mut task: Task<S>,
    inbox: Inbox,
    stop: CancellationToken,
) -> Result<(), OrderNodeError> {
    let result = run_loop(cfg, &mut task, inbox, stop).await;
    if let Some(disk) = task.runner.take_disk() {
        disk.close().await;
    }
    result
}

async fn run_loop<S: StateMachine>(
    cfg: OrderNodeConfig,
    task: &mut Task<S>,
    mut inbox: Inbox,
    stop: CancellationToken,
) -> Result<(), OrderNodeError> {
    task.submit_load()?;
    let mut next_tick = Instant::now() + cfg.tick;
    loop {
        // Work left over from the last round (answers that started new requests, entries a
        // bounded step left undelivered) must not wait for an event, but must not starve the
        // other tasks either: yield, then go on.
        let backlog = task.runner.machine().replica().has_backlog();
        if task.io.waiters.load_due > 0 || backlog {
            tokio::task::yield_now().await;
            if stop.is_cancelled() {
                return Ok(());
            }
        } else {
            tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                _ = tokio::time::sleep_until(next_tick.into()) => {}
                event = inbox.ctl.recv() => match event {
                    None => return Ok(()),
                    Some(e) => task.on_event(e)?,
                },
                Some(e) = inbox.net.recv() => task.on_event(e)?,
            }
        }
        let tick = Instant::now() >= next_tick;
        if tick {
            next_tick = Instant::now() + cfg.tick;
        }
        // Take whatever else is waiting, then seal the open batch.
        for _ in 0..1024 {
            match inbox.try_next() {
                Some(e) => task.on_event(e)?,
                None => break,
            }
        }
        task.runner.release(&mut task.io)?;
        if tick {
            task.step(Input::Tick)?;
            let replica = task.runner.machine().replica();
            let shared = &task.io.shared;
            shared.leader.store(replica.is_leader(), Ordering::Relaxed);
            shared.term.store(replica.term(), Ordering::Relaxed);
            let leader = replica.leader().unwrap_or(0);
            shared.leader_id.store(leader, Ordering::Relaxed);
            shared.commit.store(replica.commit(), Ordering::Relaxed);
            shared
                .applied
                .store(replica.final_next().saturating_sub(1), Ordering::Relaxed);
            shared
                .rebuilding
                .store(replica.lost_log(), Ordering::Relaxed);
        }
        task.runner.drain_backlog().await?;
        // A few rounds of local work per wake-up; whatever remains waits for the next one. A
        // replica with a backlog goes on after the inbox was read again (each round delivers
        // up to its budget: 64 in a row would leave its peers unheard for as long as the
        // unbounded step did).
        for _round in 0..64 {
            if !task.round().await? || task.runner.machine().replica().has_backlog() {
                break;
            }
        }
    }
}

/// Publishes where replica `me` stands as metrics: `atomos_order_is_leader`, `_term`,
/// `_commit_index`, `_applied_index`, `_apply_lag`, `_voters`, `_learners`,
/// `_snapshot_bytes`, and the snapshot streams under way both ways, `_stream_out_streams`,
/// `_stream_out_done_bytes` (acknowledged) and `_stream_out_size_bytes`, and the same `_in_`
/// (gauges); its counters as `atomos_order_replica_NAME_total`, with the bytes streamed
/// as `atomos_order_stream_out_bytes_total` and `_in_bytes_total`.
fn publish_replica<S: StateMachine>(me: Addr, replica: &atomos_order::Replica<S>) {
    let node = me.to_string();
    for (name, value) in replica.stats().counters() {
        metrics::counter!(format!("atomos_order_replica_{name}_total"), "node" => node.clone())
            .absolute(value);
    }
    let applied = replica.final_next().saturating_sub(1);
    let m = replica.membership();
    let (sending, receiving) = replica.stream_progress();
    let gauges = [
        ("atomos_order_is_leader", u64::from(replica.is_leader())),
        ("atomos_order_term", replica.term()),
        ("atomos_order_commit_index", replica.commit()),
        ("atomos_order_applied_index", applied),
        (
            "atomos_order_apply_lag",
            replica.commit().saturating_sub(applied),
        ),
        ("atomos_order_voters", m.voters.len() as u64),
        ("atomos_order_learners", m.learners.len() as u64),
        (
            "atomos_order_snapshot_bytes",
            replica.snapshot_bytes() as u64,
        ),
        ("atomos_order_stream_out_streams", sending.streams),
        ("atomos_order_stream_out_done_bytes", sending.done),
        ("atomos_order_stream_out_size_bytes", sending.total),
        ("atomos_order_stream_in_streams", receiving.streams),
        ("atomos_order_stream_in_done_bytes", receiving.done),
        ("atomos_order_stream_in_size_bytes", receiving.total),
    ];
    let streamed = [
        ("atomos_order_stream_out_bytes_total", sending.moved),
        ("atomos_order_stream_in_bytes_total", receiving.moved),
    ];
    for (name, value) in streamed {
        metrics::counter!(name, "node" => node.clone()).absolute(value);
    }
    for (name, value) in gauges {
        metrics::gauge!(name, "node" => node.clone()).set(value as f64);
    }
}
