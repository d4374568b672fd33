//! One host for a protocol machine that application threads call and wait on (TFA, oss): the
//! machine on the driver core's shared host (`driver::Shared`: stepped under a lock by whichever
//! thread brings an input), its log opened and read back before the machine is built from it,
//! its disk thread, the waiters of application threads keyed by ticket, its messages on the
//! node's wire, its timer and its health. A protocol plugs in by implementing [`Hosted`]: what
//! it is called, its time unit, how its messages travel in a [`NodeMsg`], and which waiter a
//! delivery answers. (`NodeRuntime::host` is where a runtime starts one.)

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atomos_seam::{Input, Machine};

use crate::answer::{AnswerSlot, AnswerSlots};
use crate::disk::FsyncPolicy;
use crate::driver::{open_hosted_log, Runner, Shared};
use crate::health::Health;
use crate::wire::NodeMsg;

/// A protocol machine a [`Host`] runs.
pub(crate) trait Hosted:
    Machine<Msg: Send, Delivery: Send, Request: Send> + Send + 'static
{
    /// Its name in thread, component and timer names (`tfa`, `oss`).
    const NAME: &'static str;
    /// Its time unit: the timer steps it once per unit.
    const TICK: Duration;
    /// Writes its log may queue before steps wait for the disk thread.
    const DISK_QUEUE: usize;
    /// What an application thread waits for.
    type Answer: Send + 'static;

    /// The ticket of the waiter a delivery answers, and what that waiter hears.
    fn answer(delivery: Self::Delivery) -> (u64, Self::Answer);
    /// Its message as the node's wire carries it.
    fn to_wire(msg: Self::Msg) -> NodeMsg;
    /// A message of the node's wire, if it is one of this protocol's (else it is given back).
    fn from_wire(msg: NodeMsg) -> Result<Self::Msg, NodeMsg>;
}

/// A hosted protocol machine and the application threads waiting on it.
pub(crate) struct Host<P: Hosted> {
    machine: Arc<Shared<P>>,
    waiters: AnswerSlots<P::Answer>,
    next_ticket: AtomicU64,
}

/// Sends a hosted machine's message to a node.
pub(crate) type SendFn<P> = Box<dyn Fn(u64, <P as Machine>::Msg) + Send + Sync>;

impl<P: Hosted> Host<P> {
    /// Opens node `me`'s log at `wal` (if any), builds the machine from the records read
    /// (`open`), and starts its disk thread; its messages go out through `send`, its failures
    /// to `health`.
    pub(crate) fn start(
        me: u64,
        wal: Option<&(PathBuf, FsyncPolicy)>,
        open: impl FnOnce(&[Vec<u8>]) -> Result<P, String>,
        send: SendFn<P>,
        health: Arc<Health>,
    ) -> Result<Arc<Host<P>>, String> {
        let name = P::NAME;
        let (log, disk, disk_host) =
            open_hosted_log(format!("{name}-disk-{me}"), wal, P::DISK_QUEUE)?;
        let machine = open(&log)?;
        let waiters: AnswerSlots<P::Answer> = Arc::default();
        let answers = waiters.clone();
        let deliver = Box::new(move |delivery: P::Delivery| {
            let (ticket, answer) = P::answer(delivery);
            if let Some(w) = answers.lock().get(&ticket) {
                w.put(answer);
            }
        });
        let runner = Runner::on(machine, disk, P::TICK, false);
        let component = format!("{name} node {me}");
        let machine = Arc::new(Shared::new(runner, send, deliver, health, component));
        // The disk thread reports to the host, which exists only once the log was read.
        let _ = disk_host.set(Arc::downgrade(&machine));
        Ok(Arc::new(Host {
            machine,
            waiters,
            next_ticket: AtomicU64::new(1),
        }))
    }

    /// Steps the machine with `input`; what it delivers goes to its waiters, then, with the
    /// machine unlocked (an in-memory link delivers at once, possibly back here), what it
    /// sends goes out.
    pub(crate) fn step(&self, input: Input<P::Msg, P::Request>) {
        self.machine.step(input);
    }

    /// Reads the machine's state.
    pub(crate) fn with<T>(&self, read: impl FnOnce(&P) -> T) -> T {
        self.machine.with(read)
    }

    /// A new waiter: its ticket (unique on this host) and the slot its answers arrive in,
    /// until [`Host::forget`].
    pub(crate) fn waiter(&self) -> (u64, Arc<AnswerSlot<P::Answer>>) {
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(AnswerSlot::default());
        self.waiters.lock().insert(ticket, slot.clone());
        (ticket, slot)
    }

    /// Nobody waits on `ticket` any more: later answers to it are dropped.
    pub(crate) fn forget(&self, ticket: u64) {
        self.waiters.lock().remove(&ticket);
    }

    /// Hands the request `make` builds with a fresh ticket to the machine and waits for its
    /// answer until `deadline` (polling for `poll` before it sleeps); `None` if none came.
    pub(crate) fn call(
        &self,
        make: impl FnOnce(u64) -> P::Request,
        deadline: Instant,
        poll: Duration,
    ) -> Option<P::Answer> {
        let (ticket, slot) = self.waiter();
        self.step(Input::Request(make(ticket)));
        let answer = slot.wait_until(deadline, poll);
        self.forget(ticket);
        answer
    }
}
