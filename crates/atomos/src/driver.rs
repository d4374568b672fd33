//! The driver core every protocol runs on: a [`Runner`] owns one seam machine
//! ([`atomos_seam::Machine`]) and carries out what it asks, the same way for every protocol:
//! the time of each step, disk writes handed to the machine's disk thread ([`DiskWorker`]) or,
//! for a log that is never fsynced, written on the machine's own thread ([`InlineDisk`]),
//! the seam's rule that whatever follows a write waits until the write is durable
//! ([`atomos_seam::Gate`]), persistence confirmations fed back to the machine, and errors
//! turned into a stop. Where messages go and what a delivery means is the host's business
//! ([`Carry`]). [`Shared`] is a host for any machine stepped where its inputs arrive (TFA and
//! OSS run on it through `crate::host`: a remote read wakes its application thread with no
//! task hop); the order
//! layer's task (`crate::ordering`) is a host that drains an inbox and seals its batch when
//! the inbox is empty. A new protocol is a machine on one of them, not a driver.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atomos_seam::{Bytes, Gate, Input, Machine, NodeId, Output, Write};
use parking_lot::Mutex;

use crate::disk::{DiskError, DiskWorker, FileDisk, FsyncPolicy, TryWriteError};
use crate::health::Health;

/// A step of the machine, or a write on its thread, that takes longer than this is logged:
/// the node answers nothing meanwhile, and a peer may take it for dead.
const SLOW: Duration = Duration::from_millis(500);

/// What kind of input `input` is, for the log.
fn input_kind<M, R>(input: &Input<M, R>) -> &'static str {
    match input {
        Input::Message { .. } => "message",
        Input::Tick => "tick",
        Input::Request(_) => "request",
        Input::Persisted { .. } => "persisted",
    }
}

/// Where a machine's outputs go, once nothing holds them back.
pub(crate) trait Carry<M: Machine> {
    /// Sends `msg` to node `to` (possibly this one).
    fn send(&mut self, to: NodeId, msg: M::Msg);
    /// Hands a delivery to the layers above.
    fn deliver(&mut self, delivery: M::Delivery);
    /// Tells an operator.
    fn warn(&mut self, text: String) {
        tracing::warn!("{text}");
    }
}

/// Why a runner stopped.
#[derive(Debug)]
pub(crate) enum RunError<E> {
    /// The machine failed.
    Machine(E),
    /// The disk thread stopped (why): nothing more can become durable.
    DiskStopped(String),
}

impl<E> From<E> for RunError<E> {
    fn from(e: E) -> Self {
        RunError::Machine(e)
    }
}

/// A log written on the machine's own thread, for a log that is never fsynced: a write is as
/// durable as it will ever be once the operating system has it, so what follows it goes out
/// right after the write, with no hand-over to a disk thread and back. The records a step
/// appends are written together at its end, with one system call. A rewrite (a snapshot
/// installed, as large as the state) is written on a background thread instead: what follows
/// it waits until it has replaced the log, while the machine goes on taking input.
pub(crate) struct InlineDisk {
    file: FileDisk,
    /// Writes taken (the gate's numbering).
    written: u64,
    /// Writes whose outputs were released.
    released: u64,
    /// The number of a rewrite being written in the background.
    rewrite_at: Option<u64>,
    /// Records of the current step's appends, not written yet.
    pending: Vec<Bytes>,
    /// Whether the host writes and releases at its own pace ([`Runner::release`]) rather
    /// than at the end of every step.
    held: bool,
}

impl InlineDisk {
    /// Writes on `file` if its policy is [`FsyncPolicy::Never`]; any other is given back.
    pub(crate) fn new(file: FileDisk) -> Result<InlineDisk, FileDisk> {
        if file.policy() != FsyncPolicy::Never {
            return Err(file);
        }
        Ok(InlineDisk {
            file,
            written: 0,
            released: 0,
            rewrite_at: None,
            pending: Vec::new(),
            held: false,
        })
    }

    /// Takes a write: an append joins the step's pending records; a rewrite or compaction
    /// starts replacing the log after they are written.
    fn take(&mut self, write: Write) -> Result<(), DiskError> {
        match write {
            Write::Append(records) => self.pending.extend(records),
            Write::Rewrite(records) => {
                self.write_pending()?;
                self.file.start_rewrite(&records)?;
                self.rewrite_at = Some(self.written + 1);
            }
            compact @ Write::Compact(_) => {
                self.write_pending()?;
                self.file.write(&compact)?;
            }
        }
        self.written += 1;
        Ok(())
    }

    /// Writes the pending records.
    fn write_pending(&mut self) -> Result<(), DiskError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let records = Write::Append(std::mem::take(&mut self.pending));
        self.file.write(&records)?;
        if let Write::Append(mut emptied) = records {
            emptied.clear();
            self.pending = emptied;
        }
        Ok(())
    }

    /// Writes what the step took and says through which write outputs may go now, if further
    /// than before: every write, or those before a rewrite still being written.
    fn finish_step(&mut self) -> Result<Option<u64>, DiskError> {
        self.write_pending()?;
        if self.rewrite_at.is_some() {
            self.file.land_if_written()?;
            if !self.file.rewriting() {
                self.rewrite_at = None;
            }
        }
        let through = self.rewrite_at.map_or(self.written, |at| at - 1);
        if through <= self.released {
            return Ok(None);
        }
        self.released = through;
        Ok(Some(through))
    }
}

/// A machine, its gate and its disk.
pub(crate) struct Runner<M: Machine> {
    machine: M,
    gate: Gate<Output<M::Msg, M::Delivery>>,
    disk: Option<DiskWorker>,
    /// Instead of `disk`: a log written here.
    inline: Option<InlineDisk>,
    /// Writes the disk thread's full queue could not take yet, in order.
    backlog: VecDeque<Write>,
    /// The step's outputs (kept between steps, so a step allocates nothing for them).
    out: Vec<Output<M::Msg, M::Delivery>>,
    /// Without a disk: writes kept nowhere so far, and how many the machine was told of.
    unkept: u64,
    told: u64,
    epoch: Instant,
    /// The time at `epoch`, in units (0 unless [`Runner::on_wall_clock`]).
    origin: u64,
    unit: Duration,
}

impl<M: Machine> Runner<M> {
    /// Runs `machine`, writing to `disk`, with time in units of `unit` since now. Without a
    /// disk nothing it writes is kept: no output waits, and the machine hears `Persisted`
    /// after every step that wrote (as durable as its writes will ever be).
    pub(crate) fn new(machine: M, disk: Option<DiskWorker>, unit: Duration) -> Runner<M> {
        Runner {
            machine,
            gate: Gate::new(),
            disk,
            inline: None,
            backlog: VecDeque::new(),
            out: Vec::new(),
            unkept: 0,
            told: 0,
            epoch: Instant::now(),
            origin: 0,
            unit,
        }
    }

    /// Counts the machine's time from the Unix epoch by the system clock as it reads now
    /// (and from then on by the monotonic clock, so it never goes back): for machines whose
    /// times are compared across nodes.
    pub(crate) fn on_wall_clock(mut self) -> Runner<M> {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        self.epoch = Instant::now();
        self.origin = (since_epoch.as_nanos() / self.unit.as_nanos().max(1)) as u64;
        self
    }

    /// Runs `machine` writing its log on this thread (see [`InlineDisk`]). With `held`, the
    /// writes of successive steps, and the outputs that wait for them, are kept until the host
    /// calls [`Runner::release`] (one system call for all the steps of a busy moment); else
    /// each step writes and releases at its end.
    pub(crate) fn inline(
        machine: M,
        mut disk: InlineDisk,
        unit: Duration,
        held: bool,
    ) -> Runner<M> {
        disk.held = held;
        let mut r = Runner::new(machine, None, unit);
        r.inline = Some(disk);
        r
    }

    /// The machine (to read its state).
    pub(crate) fn machine(&self) -> &M {
        &self.machine
    }

    /// The time now, in the machine's unit.
    pub(crate) fn now(&self) -> u64 {
        self.origin + (self.epoch.elapsed().as_nanos() / self.unit.as_nanos().max(1)) as u64
    }

    /// Steps the machine with `input` and carries out its outputs: writes go to the disk
    /// thread, and what follows a write waits until it is durable. Returns how many outputs
    /// the step produced.
    pub(crate) fn step(
        &mut self,
        input: Input<M::Msg, M::Request>,
        carry: &mut impl Carry<M>,
    ) -> Result<usize, RunError<M::Error>> {
        let mut out = std::mem::take(&mut self.out);
        let (kind, started) = (input_kind(&input), Instant::now());
        let stepped = self.machine.step(self.now(), input, &mut out);
        let produced = out.len();
        let took = started.elapsed();
        if took >= SLOW {
            tracing::warn!(
                input = kind,
                ms = took.as_millis() as u64,
                outputs = produced,
                "a step of the machine took long"
            );
        }
        let result = stepped
            .map_err(RunError::Machine)
            .and_then(|()| out.drain(..).try_for_each(|o| self.route(o, carry)));
        out.clear();
        self.out = out;
        result?;
        if self.inline.as_ref().is_some_and(|d| d.held) {
            return Ok(produced);
        }
        let mut produced = produced + self.release(carry)?;
        if self.unkept > self.told {
            self.told = self.unkept;
            produced += self.step(
                Input::Persisted {
                    through: self.unkept,
                },
                carry,
            )?;
        }
        Ok(produced)
    }

    /// Writes what the steps since the last release took on this thread, then carries out
    /// what waited for it, until the machine writes nothing more on hearing of it. Returns how
    /// many outputs the machine produced meanwhile.
    pub(crate) fn release(
        &mut self,
        carry: &mut impl Carry<M>,
    ) -> Result<usize, RunError<M::Error>> {
        let mut produced = 0;
        loop {
            let started = Instant::now();
            let finished = self.inline.as_mut().map(InlineDisk::finish_step);
            let took = started.elapsed();
            if took >= SLOW {
                tracing::warn!(
                    ms = took.as_millis() as u64,
                    "writing the log on the machine's thread took long"
                );
            }
            let through = match finished {
                Some(Ok(Some(through))) => through,
                Some(Ok(None)) | None => return Ok(produced),
                Some(Err(e)) => return Err(RunError::DiskStopped(e.to_string())),
            };
            produced += self.durable(through, carry)?;
        }
    }

    /// Routes one output: a write to the disk thread, anything else through the gate.
    fn route(
        &mut self,
        o: Output<M::Msg, M::Delivery>,
        carry: &mut impl Carry<M>,
    ) -> Result<(), RunError<M::Error>> {
        match o {
            Output::Persist(write) => {
                // A rewrite or compaction first writes what the step appended, and may wait
                // for a rewrite still being written: on this thread when the log is inline.
                let started = Instant::now();
                let persisted = self.persist(write);
                let took = started.elapsed();
                if took >= SLOW {
                    tracing::warn!(
                        ms = took.as_millis() as u64,
                        "writing the log on the machine's thread took long"
                    );
                }
                persisted
            }
            o => {
                if let Some(o) = self.gate.pass(o) {
                    carry_out(o, carry);
                }
                Ok(())
            }
        }
    }

    fn persist(&mut self, write: Write) -> Result<(), RunError<M::Error>> {
        if let Some(inline) = &mut self.inline {
            self.gate.write();
            return inline
                .take(write)
                .map_err(|e| RunError::DiskStopped(e.to_string()));
        }
        let Some(disk) = &self.disk else {
            // Kept nowhere: durable as it will ever be (the machine hears so after the step).
            self.unkept += 1;
            return Ok(());
        };
        self.gate.write();
        if !self.backlog.is_empty() {
            self.backlog.push_back(write);
            return Ok(());
        }
        match disk.try_write(write) {
            Ok(()) => Ok(()),
            Err(TryWriteError::Full(write)) => {
                self.backlog.push_back(write);
                Ok(())
            }
            Err(TryWriteError::Stopped(why)) => Err(RunError::DiskStopped(why)),
        }
    }

    /// The disk thread made writes up to `through` durable: what waited for them is carried
    /// out, and the machine hears of it.
    pub(crate) fn durable(
        &mut self,
        through: u64,
        carry: &mut impl Carry<M>,
    ) -> Result<usize, RunError<M::Error>> {
        for o in self.gate.durable(through) {
            carry_out(o, carry);
        }
        self.step(Input::Persisted { through }, carry)
    }

    /// Waits until the disk thread has taken every write its full queue turned away (the
    /// host's backpressure: call it before taking more input).
    pub(crate) async fn drain_backlog(&mut self) -> Result<(), RunError<M::Error>> {
        let Some(disk) = &self.disk else {
            return Ok(());
        };
        while let Some(write) = self.backlog.pop_front() {
            disk.write(write).await.map_err(RunError::DiskStopped)?;
        }
        Ok(())
    }

    /// Offers the disk thread the writes its full queue turned away, as many as it takes now
    /// (for hosts that cannot wait: the rest stay queued, in order).
    pub(crate) fn offer_backlog(&mut self) -> Result<(), RunError<M::Error>> {
        let Some(disk) = &self.disk else {
            return Ok(());
        };
        while let Some(write) = self.backlog.pop_front() {
            match disk.try_write(write) {
                Ok(()) => {}
                Err(TryWriteError::Full(write)) => {
                    self.backlog.push_front(write);
                    return Ok(());
                }
                Err(TryWriteError::Stopped(why)) => return Err(RunError::DiskStopped(why)),
            }
        }
        Ok(())
    }

    /// Takes the disk thread out (to close it when the host stops).
    pub(crate) fn take_disk(&mut self) -> Option<DiskWorker> {
        self.disk.take()
    }
}

fn carry_out<M: Machine>(o: Output<M::Msg, M::Delivery>, carry: &mut impl Carry<M>) {
    match o {
        Output::Send { to, msg } => carry.send(to, msg),
        Output::Deliver(d) => carry.deliver(d),
        Output::Warn(w) => carry.warn(w),
        Output::Persist(_) => {}
    }
}

/// Outputs collected under a host's lock, carried out after it is released.
struct Collected<M: Machine> {
    sends: Vec<(NodeId, M::Msg)>,
    deliveries: Vec<M::Delivery>,
}

impl<M: Machine> Carry<M> for Collected<M> {
    fn send(&mut self, to: NodeId, msg: M::Msg) {
        self.sends.push((to, msg));
    }

    fn deliver(&mut self, delivery: M::Delivery) {
        self.deliveries.push(delivery);
    }
}

/// Sends a machine's message to a node.
pub(crate) type SendFn<M> = Box<dyn Fn(NodeId, <M as Machine>::Msg) + Send + Sync>;
/// Hands a machine's delivery to the layers above.
pub(crate) type DeliverFn<M> = Box<dyn Fn(<M as Machine>::Delivery) + Send + Sync>;

/// A host for any machine that is stepped where its inputs arrive: the thread that brings a
/// message or a request steps it under a lock, and what the step delivers and sends is carried
/// out after the lock is released (deliveries first; an in-memory link may deliver straight
/// back). A machine error stops it: it is reported to the node's health and later inputs are
/// ignored.
pub(crate) struct Shared<M: Machine> {
    runner: Mutex<Runner<M>>,
    send: SendFn<M>,
    deliver: DeliverFn<M>,
    health: Arc<Health>,
    component: String,
    failed: AtomicBool,
}

impl<M: Machine> Shared<M> {
    /// Hosts `runner`, whose outputs go to `send` and `deliver`; failures are reported to
    /// `health` as `component`'s.
    pub(crate) fn new(
        runner: Runner<M>,
        send: SendFn<M>,
        deliver: DeliverFn<M>,
        health: Arc<Health>,
        component: String,
    ) -> Shared<M> {
        Shared {
            runner: Mutex::new(runner),
            send,
            deliver,
            health,
            component,
            failed: AtomicBool::new(false),
        }
    }

    /// Steps the machine with `input` and carries out what it produced.
    pub(crate) fn step(&self, input: Input<M::Msg, M::Request>) {
        if self.failed.load(Ordering::Relaxed) {
            return;
        }
        let mut out = Collected::<M> {
            sends: Vec::new(),
            deliveries: Vec::new(),
        };
        let result = self.runner.lock().step(input, &mut out);
        if let Err(e) = result {
            return self.stop(e);
        }
        self.carry(out);
    }

    /// The disk thread made writes up to `through` durable: what waited for them is carried
    /// out, the machine hears of it, and writes a full queue turned away are offered again.
    pub(crate) fn durable(&self, through: u64) {
        if self.failed.load(Ordering::Relaxed) {
            return;
        }
        let mut out = Collected::<M> {
            sends: Vec::new(),
            deliveries: Vec::new(),
        };
        let result = {
            let mut runner = self.runner.lock();
            runner
                .durable(through, &mut out)
                .and_then(|_| runner.offer_backlog())
        };
        if let Err(e) = result {
            return self.stop(e);
        }
        self.carry(out);
    }

    /// The disk failed: the machine stops (nothing it writes from now on could be kept).
    pub(crate) fn disk_failed(&self, why: String) {
        if !self.failed.load(Ordering::Relaxed) {
            self.stop(RunError::DiskStopped(why));
        }
    }

    fn stop(&self, e: RunError<M::Error>) {
        self.failed.store(true, Ordering::Relaxed);
        let cause = match e {
            RunError::Machine(e) => e.to_string(),
            RunError::DiskStopped(why) => why,
        };
        self.health.fail(&self.component, &cause);
    }

    fn carry(&self, out: Collected<M>) {
        for d in out.deliveries {
            (self.deliver)(d);
        }
        for (to, msg) in out.sends {
            (self.send)(to, msg);
        }
    }

    /// Reads the machine's state.
    pub(crate) fn with<T>(&self, read: impl FnOnce(&M) -> T) -> T {
        read(self.runner.lock().machine())
    }
}

/// Where a machine's log is written.
pub(crate) enum LogDisk {
    /// Nowhere: nothing is kept.
    Nowhere,
    /// On the machine's own thread (a log that is never fsynced; see [`InlineDisk`]).
    Inline(InlineDisk),
    /// On a disk thread of its own.
    Thread(DiskWorker),
}

/// Opens a machine's log at `wal` (if any) and reads its records back. Its writes go to a disk
/// thread `name` (queueing up to `queue` writes, reporting through `report`), or, when
/// `inline` allows it and the log is never fsynced, are written on the machine's own thread.
pub(crate) fn open_log(
    name: String,
    wal: Option<&(std::path::PathBuf, FsyncPolicy)>,
    queue: usize,
    inline: bool,
    report: impl Fn(crate::disk::DiskEvent) + Send + 'static,
) -> Result<(Vec<Vec<u8>>, LogDisk), DiskError> {
    let Some((path, policy)) = wal else {
        return Ok((Vec::new(), LogDisk::Nowhere));
    };
    let (mut file, records) = FileDisk::open(path, *policy)?;
    if inline {
        match InlineDisk::new(file) {
            Ok(disk) => return Ok((records, LogDisk::Inline(disk))),
            Err(fsynced) => file = fsynced,
        }
    }
    let worker = DiskWorker::spawn(name, file, queue, report).map_err(|source| DiskError::Io {
        path: path.clone(),
        source,
    })?;
    Ok((records, LogDisk::Thread(worker)))
}

impl<M: Machine> Runner<M> {
    /// Runs `machine` writing to `disk` (see [`Runner::new`] and [`Runner::inline`]; `held`
    /// applies to an inline disk).
    pub(crate) fn on(machine: M, disk: LogDisk, unit: Duration, held: bool) -> Runner<M> {
        match disk {
            LogDisk::Nowhere => Runner::new(machine, None, unit),
            LogDisk::Inline(disk) => Runner::inline(machine, disk, unit, held),
            LogDisk::Thread(worker) => Runner::new(machine, Some(worker), unit),
        }
    }
}

/// Where a hosted machine's disk thread reports, once the host exists.
pub(crate) type DiskHost<M> = std::sync::Arc<std::sync::OnceLock<std::sync::Weak<Shared<M>>>>;

/// Opens a hosted machine's log at `wal` (if any), reads it back, and starts its disk
/// thread `name`, which reports to the host set in the returned slot later (the machine,
/// and so its host, are made from the records read). Without `wal` nothing is kept.
#[allow(clippy::type_complexity)]
pub(crate) fn open_hosted_log<M>(
    name: String,
    wal: Option<&(std::path::PathBuf, FsyncPolicy)>,
    queue: usize,
) -> Result<(Vec<Vec<u8>>, LogDisk, DiskHost<M>), String>
where
    M: Machine + Send + 'static,
    M::Msg: Send,
    M::Delivery: Send,
{
    let host: DiskHost<M> = std::sync::Arc::default();
    let reports = host.clone();
    let (log, disk) = open_log(name, wal, queue, false, move |event| {
        let Some(shared) = reports.get().and_then(std::sync::Weak::upgrade) else {
            return;
        };
        match event {
            crate::disk::DiskEvent::Durable { through, .. } => shared.durable(through),
            crate::disk::DiskEvent::Failed(e) => shared.disk_failed(e.to_string()),
        }
    })
    .map_err(|e| e.to_string())?;
    Ok((log, disk, host))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::read_log;

    /// A rewrite is written in the background: outputs of the writes before it go at once,
    /// those of the writes from it on only once it has replaced the log, which then holds it
    /// and the appends made meanwhile (before, a crash leaves the log as it was).
    #[test]
    fn outputs_after_a_rewrite_wait_until_it_has_replaced_the_log() {
        let dir = std::env::temp_dir().join(format!("atomos-inline-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("wal");
        let (file, _) = FileDisk::open(&path, FsyncPolicy::Never).unwrap();
        let Ok(mut disk) = InlineDisk::new(file) else {
            panic!("a log never fsynced is written inline");
        };
        let record = |r: &'static [u8]| vec![Bytes::from_static(r)];
        disk.take(Write::Append(record(b"one"))).unwrap();
        disk.take(Write::Rewrite(record(b"whole"))).unwrap();
        disk.take(Write::Append(record(b"two"))).unwrap();
        let mut released = Vec::new();
        for _ in 0..1000 {
            match disk.finish_step().unwrap() {
                Some(3) => {
                    released.push(3);
                    break;
                }
                Some(through) => released.push(through),
                None => {}
            }
            assert_eq!(read_log(&path, false).unwrap(), vec![b"one".to_vec()]);
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            released == [1, 3] || released == [3],
            "released through {released:?}"
        );
        assert_eq!(
            read_log(&path, false).unwrap(),
            vec![b"whole".to_vec(), b"two".to_vec()]
        );
        assert_eq!(disk.finish_step().unwrap(), None, "nothing new to release");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
