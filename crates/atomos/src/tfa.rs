//! The TFA protocol in a running node: the deterministic [`TfaNode`] behind a lock, fed by the
//! node's connections and a 1 ms timer, and called by application threads through the
//! engine's remote interface (their `atomically` blocks on the answers).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atomos_core::{Key, RemoteAttempt, RemoteError, RemoteSource};
use atomos_protocols::tfa::{Answer, Failure, Reply, TfaCounters, TfaMsg, TfaNode, TfaRequest};
use atomos_seam::Input;
use parking_lot::{Condvar, Mutex};
use tracing::warn;

use crate::driver::{Carry, RunError, Runner};

/// How often the protocol's timer runs: its time unit.
pub(crate) const TICK: Duration = Duration::from_millis(1);

/// An answer slot an application thread waits on.
#[derive(Default)]
struct Waiter {
    reply: Mutex<Option<Reply>>,
    ready: Condvar,
}

struct Inner {
    runner: Runner<TfaNode>,
    waiters: HashMap<u64, Arc<Waiter>>,
}

/// Where the node's outputs go: messages are collected to be sent once the node is unlocked,
/// answers go to the application threads waiting for them.
struct TfaCarry<'a> {
    node: u64,
    waiters: &'a HashMap<u64, Arc<Waiter>>,
    outgoing: &'a mut Vec<(u64, TfaMsg)>,
}

impl Carry<TfaNode> for TfaCarry<'_> {
    fn send(&mut self, to: u64, msg: TfaMsg) {
        self.outgoing.push((to, msg));
    }

    fn deliver(&mut self, Answer { h, reply }: Answer) {
        if let Some(w) = self.waiters.get(&h) {
            *w.reply.lock() = Some(reply);
            w.ready.notify_one();
        }
    }

    fn warn(&mut self, text: String) {
        warn!(node = self.node, "{text}");
    }
}

/// Sends a protocol message to a node.
pub(crate) type SendFn = Box<dyn Fn(u64, TfaMsg) + Send + Sync>;

/// A TFA node driven by the runtime.
pub struct TfaDriver {
    inner: Mutex<Inner>,
    send: SendFn,
    next_handle: AtomicU64,
    /// How long an application thread waits for an answer before giving up on the node it
    /// asked (the protocol answers within its request timeout unless its timer stopped).
    patience: Duration,
}

impl TfaDriver {
    pub(crate) fn new(node: TfaNode, send: SendFn, patience: Duration) -> Arc<TfaDriver> {
        Arc::new(TfaDriver {
            inner: Mutex::new(Inner {
                runner: Runner::new(node, None, TICK),
                waiters: HashMap::new(),
            }),
            send,
            next_handle: AtomicU64::new(1),
            patience,
        })
    }

    /// Steps the node with `input` and carries out its outputs: answers go to their waiters,
    /// then, with the node unlocked (an in-memory link delivers at once, possibly back here),
    /// messages go out. TFA persists nothing, so no output waits for a disk.
    fn step(&self, input: Input<TfaMsg, TfaRequest>) {
        let mut outgoing = Vec::new();
        {
            let mut inner = self.inner.lock();
            self.step_locked(&mut inner, input, &mut outgoing);
        }
        for (to, msg) in outgoing {
            (self.send)(to, msg);
        }
    }

    fn step_locked(
        &self,
        inner: &mut Inner,
        input: Input<TfaMsg, TfaRequest>,
        outgoing: &mut Vec<(u64, TfaMsg)>,
    ) {
        let Inner { runner, waiters } = inner;
        let mut carry = TfaCarry {
            node: runner.machine().id(),
            waiters,
            outgoing,
        };
        match runner.step(input, &mut carry) {
            Ok(_) => {}
            Err(RunError::Machine(never)) => match never {},
            // TFA runs without a disk.
            Err(RunError::DiskStopped) => {}
        }
    }

    /// A message from node `from`.
    pub(crate) fn message(&self, from: u64, msg: TfaMsg) {
        self.step(Input::Message { from, msg });
    }

    /// The timer.
    pub(crate) fn tick(&self) {
        self.step(Input::Tick);
    }

    /// A request of the application's, with the node locked (and nothing to send).
    fn request_quietly(&self, inner: &mut Inner, request: TfaRequest) {
        let mut outgoing = Vec::new();
        self.step_locked(inner, Input::Request(request), &mut outgoing);
        // Begin, forget and abort change only this node's state (TFA's node takes no output
        // for them), so nothing is sent with the node locked.
        debug_assert!(outgoing.is_empty(), "a quiet request sent messages");
    }

    /// The node's counters.
    pub fn counters(&self) -> TfaCounters {
        self.inner.lock().runner.machine().counters().clone()
    }

    /// Locks held on this node's objects right now.
    pub fn locks_held(&self) -> usize {
        self.inner.lock().runner.machine().objects().locks_held()
    }

    /// Abstract locks (open nesting) this node is home to and holds right now.
    pub fn abstract_locks_held(&self) -> usize {
        self.inner.lock().runner.machine().abstract_locks_held()
    }

    /// Objects this node owns right now (deleted ones included).
    pub fn objects_owned(&self) -> usize {
        self.inner.lock().runner.machine().objects().len()
    }
}

/// Starts attempts on a driver (what the engine calls).
pub(crate) struct TfaSource(pub(crate) Arc<TfaDriver>);

impl RemoteSource for TfaSource {
    fn begin(&self) -> Box<dyn RemoteAttempt> {
        let driver = self.0.clone();
        let h = driver.next_handle.fetch_add(1, Ordering::Relaxed);
        let waiter = Arc::new(Waiter::default());
        {
            let mut inner = driver.inner.lock();
            driver.request_quietly(&mut inner, TfaRequest::Begin { h });
            inner.waiters.insert(h, waiter.clone());
        }
        Box::new(TfaAttempt {
            driver,
            h,
            waiter,
            over: false,
        })
    }

    fn release_abstract(&self, family: u64, names: Vec<String>) {
        self.0.step(Input::Request(TfaRequest::ReleaseAbstract {
            family,
            names,
        }));
    }
}

/// One attempt: its handle in the node and the slot its answers arrive in.
struct TfaAttempt {
    driver: Arc<TfaDriver>,
    h: u64,
    waiter: Arc<Waiter>,
    /// The node ended the transaction (it failed or committed).
    over: bool,
}

fn remote_error(f: Failure) -> RemoteError {
    match f {
        Failure::Conflict(c) => RemoteError::Conflict(c),
        Failure::Stale(keys) => RemoteError::Stale { keys },
        Failure::Unavailable { key, node } => RemoteError::Unavailable { key, node },
    }
}

impl TfaAttempt {
    /// Hands `request` to the node and waits for the answer.
    fn call(&mut self, key: &Key, request: TfaRequest) -> Result<Reply, RemoteError> {
        // An answer that arrived while the application was busy ended the transaction.
        if let Some(r) = self.waiter.reply.lock().take() {
            self.over = true;
            return Err(match r {
                Reply::Read(Err(f)) | Reply::Commit(Err(f)) => remote_error(f),
                _ => RemoteError::Conflict(atomos_core::AbortCause::CommitValidation),
            });
        }
        self.driver.step(Input::Request(request));
        let mut slot = self.waiter.reply.lock();
        let deadline = Instant::now() + self.driver.patience;
        while slot.is_none() {
            if self
                .waiter
                .ready
                .wait_until(&mut slot, deadline)
                .timed_out()
                && slot.is_none()
            {
                self.over = true;
                let node = self.driver.inner.lock().runner.machine().id();
                return Err(RemoteError::Unavailable {
                    key: key.clone(),
                    node,
                });
            }
        }
        Ok(slot.take().expect("checked"))
    }
}

impl RemoteAttempt for TfaAttempt {
    fn read(&mut self, key: &Key) -> Result<Option<Vec<u8>>, RemoteError> {
        let request = TfaRequest::Read {
            h: self.h,
            key: key.clone(),
        };
        match self.call(key, request)? {
            Reply::Read(Ok(v)) => Ok(v),
            // The transaction stays open: the engine forgets part of it or aborts it.
            Reply::Read(Err(f @ Failure::Stale(_))) => Err(remote_error(f)),
            Reply::Read(Err(f)) | Reply::Commit(Err(f)) => {
                self.over = true;
                Err(remote_error(f))
            }
            Reply::Commit(Ok(())) | Reply::Abstract(_) => {
                unreachable!("a read is answered by a read")
            }
        }
    }

    fn abstract_lock(&mut self, family: u64, name: &str) -> Result<bool, RemoteError> {
        let request = TfaRequest::AbstractLock {
            h: self.h,
            family,
            name: name.to_string(),
        };
        match self.call(&Key::from(name), request)? {
            Reply::Abstract(Ok(taken)) => Ok(taken),
            // Refused: the transaction stays open (the engine aborts it).
            Reply::Abstract(Err(f)) => Err(remote_error(f)),
            Reply::Read(Err(f)) | Reply::Commit(Err(f)) => {
                self.over = true;
                Err(remote_error(f))
            }
            Reply::Read(Ok(_)) | Reply::Commit(Ok(())) => {
                unreachable!("an abstract lock is answered by an abstract lock")
            }
        }
    }

    fn commit(&mut self, writes: Vec<(Key, Option<Vec<u8>>)>) -> Result<(), RemoteError> {
        let h = self.h;
        let key = writes
            .first()
            .map(|w| w.0.clone())
            .unwrap_or_else(|| Key::from_bytes(&[]));
        let reply = self.call(&key, TfaRequest::Commit { h, writes });
        // Stale reads leave the transaction open (the engine resumes or aborts it).
        self.over = !matches!(reply, Ok(Reply::Commit(Err(Failure::Stale(_)))));
        match reply? {
            Reply::Commit(Ok(())) => Ok(()),
            Reply::Read(Err(f)) | Reply::Commit(Err(f)) => Err(remote_error(f)),
            Reply::Read(Ok(_)) | Reply::Abstract(_) => {
                unreachable!("a commit is answered by a commit")
            }
        }
    }

    fn forget(&mut self, keys: &[Key]) {
        if !self.over {
            let request = TfaRequest::Forget {
                h: self.h,
                keys: keys.to_vec(),
            };
            self.driver
                .request_quietly(&mut self.driver.inner.lock(), request);
        }
    }

    fn abort(&mut self) {
        if !self.over {
            self.over = true;
            let request = TfaRequest::Abort { h: self.h };
            self.driver
                .request_quietly(&mut self.driver.inner.lock(), request);
        }
    }
}

impl Drop for TfaAttempt {
    fn drop(&mut self) {
        let mut inner = self.driver.inner.lock();
        if !self.over {
            self.driver
                .request_quietly(&mut inner, TfaRequest::Abort { h: self.h });
        }
        inner.waiters.remove(&self.h);
    }
}
