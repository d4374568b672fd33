//! The TFA protocol in a running node: the deterministic [`TfaNode`] on the node's protocol host
//! (`crate::host`: stepped under a lock by whichever thread brings an input), fed by the node's
//! connections and a 1 ms timer, and called by application threads through the engine's remote
//! interface (their `atomically` blocks on the answers).

use std::sync::Arc;
use std::time::{Duration, Instant};

use atomos_core::{Key, RemoteAttempt, RemoteError, RemoteSource};
use atomos_protocols::tfa::{Answer, Failure, Reply, TfaCounters, TfaMsg, TfaNode, TfaRequest};
use atomos_seam::Input;

use crate::answer::AnswerSlot;
use crate::host::{Host, Hosted};
use crate::wire::NodeMsg;

/// How often the protocol's timer runs: its time unit.
pub(crate) const TICK: Duration = Duration::from_millis(1);

impl Hosted for TfaNode {
    const NAME: &'static str = "tfa";
    const TICK: Duration = TICK;
    /// Writes are rare: new owners of the keys this node is home to.
    const DISK_QUEUE: usize = 1024;
    type Answer = Reply;

    fn answer(Answer { h, reply }: Answer) -> (u64, Reply) {
        (h, reply)
    }

    fn to_wire(msg: TfaMsg) -> NodeMsg {
        NodeMsg::Tfa(msg)
    }

    fn from_wire(msg: NodeMsg) -> Result<TfaMsg, NodeMsg> {
        match msg {
            NodeMsg::Tfa(msg) => Ok(msg),
            other => Err(other),
        }
    }
}

/// A TFA node driven by the runtime.
pub struct TfaDriver {
    host: Arc<Host<TfaNode>>,
    /// How long an application thread waits for an answer before giving up on the node it
    /// asked (the protocol answers within its request timeout unless its timer stopped).
    patience: Duration,
    /// How long a waiting application thread polls for its answer before it sleeps.
    answer_poll: Duration,
}

impl TfaDriver {
    /// The driver of the TFA node `host` runs; application threads wait up to `patience` for
    /// an answer, polling for `answer_poll` before they sleep.
    pub(crate) fn new(
        host: Arc<Host<TfaNode>>,
        patience: Duration,
        answer_poll: Duration,
    ) -> TfaDriver {
        TfaDriver {
            host,
            patience,
            answer_poll,
        }
    }

    /// The incarnation a node starts under: larger than every earlier run's (its start time
    /// in seconds, or the last run's plus one), as its log `log` says.
    pub(crate) fn incarnation(me: u64, log: &[Vec<u8>]) -> Result<u64, String> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() & 0xFFFF_FFFF);
        let last = TfaNode::last_incarnation(me, log).map_err(|e| e.to_string())?;
        Ok(last.map_or(now, |last| now.max(last + 1)))
    }

    fn step(&self, input: Input<TfaMsg, TfaRequest>) {
        self.host.step(input);
    }

    /// The node's counters.
    pub fn counters(&self) -> TfaCounters {
        self.host.with(|n| n.counters().clone())
    }

    /// Locks held on this node's objects right now.
    pub fn locks_held(&self) -> usize {
        self.host.with(|n| n.objects().locks_held())
    }

    /// Abstract locks (open nesting) this node is home to and holds right now.
    pub fn abstract_locks_held(&self) -> usize {
        self.host.with(TfaNode::abstract_locks_held)
    }

    /// Objects this node owns right now (deleted ones included).
    pub fn objects_owned(&self) -> usize {
        self.host.with(|n| n.objects().len())
    }
}

/// Starts attempts on a driver (what the engine calls).
pub(crate) struct TfaSource(pub(crate) Arc<TfaDriver>);

impl RemoteSource for TfaSource {
    fn begin(&self) -> Box<dyn RemoteAttempt> {
        let driver = self.0.clone();
        // The transaction's handle in the node is its waiter's ticket.
        let (h, waiter) = driver.host.waiter();
        driver.step(Input::Request(TfaRequest::Begin { h }));
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
    waiter: Arc<AnswerSlot<Reply>>,
    /// The node ended the transaction (it failed or committed).
    over: bool,
}

fn remote_error(f: Failure) -> RemoteError {
    match f {
        Failure::Conflict(c) => RemoteError::Conflict(c),
        Failure::Stale(keys) => RemoteError::Stale { keys },
        Failure::Unavailable { key, node } => RemoteError::Unavailable { key, node },
        Failure::Lost { key, node } => RemoteError::Lost { key, node },
    }
}

impl TfaAttempt {
    /// Hands `request` to the node and waits for the answer.
    fn call(&mut self, key: &Key, request: TfaRequest) -> Result<Reply, RemoteError> {
        // An answer that arrived while the application was busy ended the transaction.
        if let Some(r) = self.waiter.take() {
            self.over = true;
            return Err(match r {
                Reply::Read(Err(f)) | Reply::Commit(Err(f)) => remote_error(f),
                _ => RemoteError::Conflict(atomos_core::AbortCause::CommitValidation),
            });
        }
        self.driver.step(Input::Request(request));
        let deadline = Instant::now() + self.driver.patience;
        match self.waiter.wait_until(deadline, self.driver.answer_poll) {
            Some(reply) => Ok(reply),
            None => {
                self.over = true;
                let node = self.driver.host.with(TfaNode::id);
                Err(RemoteError::Unavailable {
                    key: key.clone(),
                    node,
                })
            }
        }
    }

    /// Makes the read `request` of `key` and takes its answer.
    fn read_reply(
        &mut self,
        key: &Key,
        request: TfaRequest,
    ) -> Result<Option<Vec<u8>>, RemoteError> {
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
}

impl RemoteAttempt for TfaAttempt {
    fn read(&mut self, key: &Key) -> Result<Option<Vec<u8>>, RemoteError> {
        let request = TfaRequest::Read {
            h: self.h,
            key: key.clone(),
        };
        self.read_reply(key, request)
    }

    fn read_for_write(&mut self, key: &Key) -> Result<Option<Vec<u8>>, RemoteError> {
        let request = TfaRequest::ReadForWrite {
            h: self.h,
            key: key.clone(),
        };
        self.read_reply(key, request)
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
            self.driver.step(Input::Request(TfaRequest::Forget {
                h: self.h,
                keys: keys.to_vec(),
            }));
        }
    }

    fn abort(&mut self) {
        if !self.over {
            self.over = true;
            self.driver
                .step(Input::Request(TfaRequest::Abort { h: self.h }));
        }
    }
}

impl Drop for TfaAttempt {
    fn drop(&mut self) {
        if !self.over {
            self.driver
                .step(Input::Request(TfaRequest::Abort { h: self.h }));
        }
        self.driver.host.forget(self.h);
    }
}
