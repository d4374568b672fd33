//! The replica's task: it steps the replica on ticks, peers' messages, local submissions and
//! disk confirmations, carries out what the replica asks, and runs the node's local clients
//! (application submissions and generated load).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use atomos_net::transport::Transport;
use atomos_order::{
    Addr, Client, ClientAction, ClientInput, Command, Delivery, Input, OrderError, OrderMsg,
    Replica, StateMachine,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::disk::DiskEvent;
use crate::driver::{Carry, RunError, Runner};

use super::{
    Answer, Event, LoadHooks, OrderNodeConfig, OrderNodeError, Reply, Shared,
    MACHINE_COUNTERS_EVERY,
};

/// Who waits for a client's answer.
enum Waiter {
    /// An application's `submit`.
    App(Reply),
    /// Nobody: generated load, with its payload.
    Load(Vec<u8>),
}

/// The local clients: application submissions and generated load.
pub(super) struct Clients {
    me: Addr,
    replicas: Vec<Addr>,
    resend_ticks: u64,
    base: u64,
    next: u64,
    /// Client id -> the client and who waits for its answer (`None`: generated load).
    active: BTreeMap<u64, (Client, Waiter)>,
    idle: Vec<Client>,
    load_payload: Vec<u8>,
    hooks: Option<LoadHooks>,
    generated: u64,
}

impl Clients {
    pub(super) fn new(cfg: &OrderNodeConfig) -> Clients {
        let me = cfg.replica.id;
        // The local replica first, then the others.
        let mut replicas = vec![me];
        replicas.extend(cfg.replica.replicas.iter().copied().filter(|&r| r != me));
        Clients {
            me,
            replicas,
            resend_ticks: cfg.client_resend_ticks,
            // Random, so a restarted node never reuses a client id (and its sequence numbers).
            base: rand::random::<u64>() & !0xFFFF_FFFF,
            next: 0,
            active: BTreeMap::new(),
            idle: Vec::new(),
            load_payload: vec![7; cfg.load_request_bytes],
            hooks: cfg.load_hooks.clone(),
            generated: 0,
        }
    }

    fn next_load(&mut self) -> Vec<u8> {
        self.generated += 1;
        match &self.hooks {
            Some(h) => (h.payload)(self.generated - 1),
            None => self.load_payload.clone(),
        }
    }

    fn take(&mut self) -> Client {
        self.idle.pop().unwrap_or_else(|| {
            self.next += 1;
            Client::new(
                self.base | self.next,
                self.replicas.clone(),
                0,
                self.resend_ticks,
            )
        })
    }

    fn submit(
        &mut self,
        payload: Vec<u8>,
        deadline_ms: u64,
        reply: Waiter,
        out: &mut Vec<ClientAction>,
    ) {
        let mut client = self.take();
        let submit = ClientInput::Submit {
            payload,
            deadline_ms,
        };
        client.step(submit, out);
        self.active.insert(client.id(), (client, reply));
    }

    /// Generated load has no deadline (every request of it is answered).
    fn submit_load(&mut self, out: &mut Vec<ClientAction>) {
        let payload = self.next_load();
        let deadline = atomos_order::NO_DEADLINE;
        self.submit(payload.clone(), deadline, Waiter::Load(payload), out);
    }
}

/// The replica's task: the replica in its runner (time, disk, gate) and everything else.
pub(super) struct Task<S: StateMachine> {
    pub(super) runner: Runner<Replica<S>>,
    pub(super) io: OrderIo,
}

/// Where the replica's outputs go, and the local clients.
pub(super) struct OrderIo {
    pub(super) me: Addr,
    pub(super) transport: Arc<dyn Transport<OrderMsg>>,
    pub(super) shared: Arc<Shared>,
    pub(super) clients: Clients,
    pub(super) client_out: Vec<ClientAction>,
    /// Messages from this node to itself.
    pub(super) local: VecDeque<(Addr, OrderMsg)>,
    pub(super) opt_at: BTreeMap<u64, Instant>,
    /// When the state machine's counters are published next.
    pub(super) counters_due: Instant,
}

impl<S: StateMachine> Carry<Replica<S>> for OrderIo {
    fn send(&mut self, to: Addr, msg: OrderMsg) {
        let me = self.me;
        match msg {
            msg if to == me && msg.answered_client().is_some() => {
                answer(&mut self.clients, &self.shared, msg, &mut self.client_out)
            }
            msg if to == me => self.local.push_back((me, msg)),
            msg => {
                let _ = self.transport.send(to, msg);
            }
        }
    }

    fn deliver(&mut self, d: Delivery) {
        let shared = &self.shared;
        match &d {
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
    /// Steps the replica; returns how many outputs it produced.
    fn step(&mut self, input: Input) -> Result<usize, OrderNodeError> {
        Ok(self.runner.step(input, &mut self.io)?)
    }

    fn on_event(&mut self, e: Event) -> Result<(), OrderNodeError> {
        let io = &mut self.io;
        match e {
            Event::Net { msg, .. } if msg.answered_client().is_some() => {
                // Answers to our clients' requests re-sent to other replicas.
                answer(&mut io.clients, &io.shared, msg, &mut io.client_out);
            }
            Event::Net { from, msg } => {
                self.step(Input::Message { from, msg })?;
            }
            Event::Submit {
                payload,
                deadline_ms,
                reply,
            } => {
                io.clients
                    .submit(payload, deadline_ms, Waiter::App(reply), &mut io.client_out);
            }
            Event::Disk(DiskEvent::Durable { through, .. }) => {
                self.runner.durable(through, &mut self.io)?;
            }
            Event::Disk(DiskEvent::Failed(e)) => return Err(e.into()),
        }
        Ok(())
    }

    /// Local work: clients' messages out, messages to itself in, the open batch sealed.
    /// Returns whether the replica produced anything.
    async fn round(&mut self) -> Result<bool, OrderNodeError> {
        let me = self.io.me;
        for a in std::mem::take(&mut self.io.client_out) {
            match a {
                ClientAction::Send { to, msg } if to == me => self.io.local.push_back((me, msg)),
                ClientAction::Send { to, msg } => {
                    let _ = self.io.transport.send(to, msg);
                }
                ClientAction::Done { .. } | ClientAction::Expired { .. } => {}
            }
        }
        let mut produced = 0;
        while let Some((from, msg)) = self.io.local.pop_front() {
            produced += self.step(Input::Message { from, msg })?;
        }
        produced += self.step(Input::Request(Command::Flush))?;
        produced += self.runner.release(&mut self.io)?;
        // Backpressure: wait while the disk thread cannot take more writes.
        self.runner.drain_backlog().await?;
        self.io.shared.requests_delivered.store(
            self.runner.machine().stats().requests_delivered,
            Ordering::Relaxed,
        );
        let now = Instant::now();
        if now >= self.io.counters_due {
            self.io.counters_due = now + MACHINE_COUNTERS_EVERY;
            let counters = self.runner.machine().machine().counters();
            self.io.shared.publish_machine(self.io.me, counters);
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
    for _ in 0..cfg.load_clients {
        task.io.clients.submit_load(&mut task.io.client_out);
    }
    let mut next_tick = Instant::now() + cfg.tick;
    loop {
        // Work left over from the last round (answers that started new requests) must not
        // wait for an event, but must not starve the other tasks either: yield, then go on.
        if !task.io.client_out.is_empty() || !task.io.local.is_empty() {
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
            let io = &mut task.io;
            for (c, _) in io.clients.active.values_mut() {
                c.step(ClientInput::Tick, &mut io.client_out);
            }
            let replica = task.runner.machine();
            io.shared
                .leader
                .store(replica.is_leader(), Ordering::Relaxed);
            io.shared.term.store(replica.term(), Ordering::Relaxed);
        }
        task.runner.drain_backlog().await?;
        // A few rounds of local work per wake-up; whatever remains waits for the next one.
        for _round in 0..64 {
            if !task.round().await? {
                break;
            }
        }
    }
}

/// Hands a reply to the local client it is for. When that finishes the client's request, the
/// answer goes to its waiter (or, for generated load, the next request is submitted).
fn answer(
    clients: &mut Clients,
    shared: &Shared,
    reply: OrderMsg,
    client_out: &mut Vec<ClientAction>,
) {
    let Some(client) = reply.answered_client() else {
        return;
    };
    let Some((c, _)) = clients.active.get_mut(&client) else {
        return;
    };
    let mut done = Vec::new();
    c.step(
        ClientInput::Message {
            from: clients.me,
            msg: reply,
        },
        &mut done,
    );
    let outcome = match done.pop() {
        Some(ClientAction::Done { response, .. }) => Answer::Applied(response),
        Some(ClientAction::Expired { .. }) => Answer::Expired,
        _ => return,
    };
    let Some((mut c, waiter)) = clients.active.remove(&client) else {
        return;
    };
    match waiter {
        Waiter::App(reply) => {
            reply.send(outcome);
            clients.idle.push(c);
        }
        Waiter::Load(done) => {
            if let Some(h) = &clients.hooks {
                (h.answered)(&done);
            }
            let payload = clients.next_load();
            let submit = ClientInput::Submit {
                payload: payload.clone(),
                deadline_ms: atomos_order::NO_DEADLINE,
            };
            c.step(submit, client_out);
            clients.active.insert(client, (c, Waiter::Load(payload)));
            shared.load_answered.fetch_add(1, Ordering::Relaxed);
        }
    }
}
