//! The node: the handle applications run transactions through.

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use atomos_core::{
    decode_result, encode_arguments, ContentionPolicy, Engine, EngineConfig, Key, Outcome,
    ProcedureKind, Procedures, RegisterError, Stats, Step, Tx, TxError, TxOptions,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// How a node keeps its objects consistent with other nodes. Application code is the same under
/// every protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Protocol {
    /// One node, objects in this process only.
    #[default]
    Local,
    /// The Transaction Forwarding Algorithm (HyflowCPP): every object lives on one node at a
    /// time and moves to the node that writes it; node clocks keep transactions opaque. Needs
    /// a runtime ([`NodeRuntime`](crate::NodeRuntime) or [`Cluster`](crate::Cluster)); a node
    /// built alone keeps its objects locally.
    Tfa,
    /// Certification over the order layer (Paxos STM's deferred update): every replica holds
    /// every object; transactions run locally, and an update's reads and writes are certified
    /// in one total order on every replica. Read-only transactions never leave the node and
    /// never abort. Survives the crash of a minority. Needs a runtime; a node built alone
    /// keeps its objects locally.
    Certify,
    /// Active replication (HiperTM): every replica holds every object, and update procedures
    /// ([`Node::invoke`]) are ordered first and run on every replica, speculatively as soon
    /// as their order is known optimistically, committed when it is final: they never abort
    /// on a conflict. Closures ([`Node::atomically`]) are certified between them as under
    /// `certify`. Read-only transactions and read-only procedures run on the caller's node
    /// from a snapshot and never abort. Survives the crash of a minority. Needs a runtime; a
    /// node built alone runs everything locally.
    Active,
    /// The Object Sharing Service's commits: every node holds every object (but keys under
    /// `local/`, which are its own and commit without the network); one sequencer per
    /// consistency domain numbers the commits and write sets go to every node directly,
    /// applied in commit-id order once a majority holds them. Who sequences is decided
    /// through the order layer. Needs a runtime; a node built alone keeps its objects
    /// locally.
    Oss,
}

impl Protocol {
    /// Whether every node holds every object (`certify`, `active`, `oss`).
    pub fn is_replicated(self) -> bool {
        matches!(self, Protocol::Certify | Protocol::Active | Protocol::Oss)
    }

    /// Whether commits go through the order layer's replicated store (`certify`, `active`).
    pub fn is_ordered(self) -> bool {
        matches!(self, Protocol::Certify | Protocol::Active)
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Protocol::Local => f.write_str("local"),
            Protocol::Tfa => f.write_str("tfa"),
            Protocol::Certify => f.write_str("certify"),
            Protocol::Active => f.write_str("active"),
            Protocol::Oss => f.write_str("oss"),
        }
    }
}

impl FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "local" => Ok(Protocol::Local),
            "tfa" => Ok(Protocol::Tfa),
            "certify" => Ok(Protocol::Certify),
            "active" => Ok(Protocol::Active),
            "oss" => Ok(Protocol::Oss),
            other => Err(format!(
                "unknown protocol {other:?} (known: local, tfa, certify, active, oss)"
            )),
        }
    }
}

/// Settings of a node.
#[derive(Clone, Debug, Default)]
pub struct NodeConfig {
    /// The consistency protocol.
    pub protocol: Protocol,
    /// The node's contention manager (transactions may override it).
    pub contention: ContentionPolicy,
    /// Options transactions get when their caller gives none.
    pub default_options: TxOptions,
    /// Record committed transactions for the serializability checker (tests only: slow).
    pub record_history: bool,
    /// Name the objects in conflict counts ([`Node::hot_spots`]) under every protocol (the
    /// replicated ones always do): one table entry per object.
    pub monitor_conflicts: bool,
}

/// A node: owns the transactional engine and runs transactions on it. Cloning a `Node` gives
/// another handle to the same node, usable from any thread.
#[derive(Clone)]
pub struct Node {
    engine: Arc<Engine>,
    protocol: Protocol,
    procedures: Procedures,
    /// Where update procedures are ordered under `active`, once its runtime started.
    invoker: Arc<OnceLock<Arc<dyn Invoker>>>,
}

/// How long an invocation answered by another replica waits for this one to apply it too.
const APPLIED_WAIT: Duration = Duration::from_secs(10);

/// Orders a procedure invocation and returns what it came to (the `active` runtime).
pub(crate) trait Invoker: Send + Sync {
    /// Orders `procedure` with encoded `arguments` and waits for its outcome; returns the
    /// log position it was applied at, and the outcome.
    fn invoke(&self, procedure: &str, arguments: Vec<u8>) -> Result<(u64, Outcome), TxError>;
}

impl Node {
    /// A single local node with default settings.
    pub fn local() -> Node {
        Node::new(NodeConfig::default())
    }

    /// A node with the given settings.
    pub fn new(config: NodeConfig) -> Node {
        Node::with_procedures(config, Procedures::new())
    }

    /// A node with the given settings whose procedures are those of `procedures` (a registry
    /// filled before the node's runtime starts, as `active` needs; see [`Node::register`]).
    pub fn with_procedures(config: NodeConfig, procedures: Procedures) -> Node {
        let engine = Engine::new(EngineConfig {
            contention: config.contention,
            record_history: config.record_history,
            default_options: config.default_options,
            replicated: config.protocol.is_replicated(),
            monitor_conflicts: config.monitor_conflicts,
        });
        Node {
            engine: Arc::new(engine),
            protocol: config.protocol,
            procedures,
            invoker: Arc::new(OnceLock::new()),
        }
    }

    /// Orders this node's update procedures through `invoker` from now on (once).
    pub(crate) fn set_invoker(&self, invoker: Arc<dyn Invoker>) -> bool {
        self.invoker.set(invoker).is_ok()
    }

    /// The `n` objects that made this node's transactions abort most often, most first, with
    /// their conflict counts (OSS's monitoring facility: where an application's hot spots
    /// are). See [`NodeConfig::monitor_conflicts`].
    pub fn hot_spots(&self, n: usize) -> Vec<(Key, u64)> {
        self.engine.hot_spots(n)
    }

    /// The node's protocol.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// A chain of linked transactions on this node (OSS III-C): each transaction runs while
    /// the commits of the chain's earlier ones are still being decided, at most `queue` (at
    /// least 1) of them at once. See [`Linked`](crate::Linked).
    pub fn linked(&self, queue: usize) -> crate::Linked {
        crate::Linked::new(self.engine().clone(), queue)
    }

    /// The engine behind this node.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Counters since the node started.
    pub fn stats(&self) -> Stats {
        self.engine.stats()
    }

    /// Runs `f` as a transaction, re-running it on conflict, and returns its result. Errors other
    /// than conflicts abort the transaction and are returned unchanged.
    pub fn atomically<R>(
        &self,
        f: impl FnMut(&mut Tx<'_>) -> Result<R, TxError>,
    ) -> Result<R, TxError> {
        self.engine.atomically(f)
    }

    /// Like [`Node::atomically`] with the application's own error type: `?` works on
    /// transactional operations (through `From<TxError>`) and on the application's calls.
    pub fn try_atomically<R, E: From<TxError>>(
        &self,
        f: impl FnMut(&mut Tx<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        self.engine.run(&self.engine.config().default_options, f)
    }

    /// Runs `f` as a read-only transaction over a consistent snapshot, and a write inside it
    /// is an error ([`TxError::WriteInReadOnly`]). On one node (`local`) it never aborts. Under
    /// `tfa` an object has one current copy and no old versions: a read-only transaction whose
    /// reads go stale before it finishes is re-run (it never sees an inconsistent state).
    pub fn atomically_read<R>(
        &self,
        f: impl FnMut(&mut Tx<'_>) -> Result<R, TxError>,
    ) -> Result<R, TxError> {
        let opts = TxOptions {
            read_only: true,
            ..self.engine.config().default_options.clone()
        };
        self.engine.run(&opts, f)
    }

    /// Waits until this node has applied everything committed anywhere before the call
    /// (under `certify`; under other protocols every commit is visible at once). Fails with
    /// [`TxError::ClusterUnavailable`] if a majority cannot be reached in time.
    pub fn sync(&self) -> Result<(), TxError> {
        self.engine.sync()
    }

    /// Registers an update procedure: a named transaction with typed (serde) arguments and
    /// result, run by [`Node::invoke`]. Code written with procedures runs under every
    /// protocol: under `local`, `tfa` and `certify` an invocation runs as a transaction on the
    /// caller's node. A body must be **deterministic** (no clock, no randomness, nothing
    /// outside its transaction: whatever varies comes in with the arguments), because a
    /// replicated protocol may run it on every replica; like any transaction it may be re-run
    /// on a conflict. Every node of a cluster registers the same procedures under the same
    /// names, under `active` before its runtime starts. A name is registered once
    /// ([`RegisterError::Taken`]). Under `active` a body may only read and write: new
    /// anonymous objects, abstract locks, open nesting, on-commit and on-abort actions fail
    /// it with [`TxError::NotInProcedure`], and so does `retry()`.
    pub fn register<A, R, F>(&self, name: &str, body: F) -> Result<(), RegisterError>
    where
        A: DeserializeOwned + 'static,
        R: Serialize + 'static,
        F: Fn(&mut Tx<'_>, &A) -> Result<R, TxError> + Send + Sync + 'static,
    {
        self.procedures.register(name, ProcedureKind::Update, body)
    }

    /// Registers a read-only procedure (see [`Node::register`]): it runs as a read-only
    /// transaction over a snapshot, never aborts where read-only transactions never do, and a
    /// write inside it fails with [`TxError::WriteInReadOnly`].
    pub fn register_read_only<A, R, F>(&self, name: &str, body: F) -> Result<(), RegisterError>
    where
        A: DeserializeOwned + 'static,
        R: Serialize + 'static,
        F: Fn(&mut Tx<'_>, &A) -> Result<R, TxError> + Send + Sync + 'static,
    {
        self.procedures
            .register(name, ProcedureKind::ReadOnly, body)
    }

    /// Invokes the procedure registered under `name` with `args` and returns its result once
    /// it committed. Fails with [`TxError::NoSuchProcedure`] for an unknown name, with
    /// [`TxError::ProcedureTypes`] when `A` or `R` are not the types it was registered with
    /// (nothing runs then), and otherwise as its transaction does.
    ///
    /// Under `active` an update procedure is ordered and run on every replica (register it on
    /// every node before anything invokes it); its own error comes back as
    /// [`TxError::User`] with the error's text, and an invocation whose outcome did not come
    /// back within the commit limit fails with [`TxError::OutcomeUnknown`] (it may have run).
    /// Read-only procedures run on this node from a snapshot, under every protocol.
    pub fn invoke<A, R>(&self, name: &str, args: &A) -> Result<R, TxError>
    where
        A: Serialize + 'static,
        R: DeserializeOwned + 'static,
    {
        self.procedures.get(name)?.check_types::<A, R>()?;
        let result = self.invoke_encoded(name, &encode_arguments(name, args)?)?;
        decode_result(name, &result)
    }

    /// Invokes the procedure registered under `name` with encoded arguments and returns its
    /// encoded result (see [`Node::invoke`]; a remote client's request, whose types the node
    /// cannot check).
    pub fn invoke_encoded(&self, name: &str, bytes: &[u8]) -> Result<Vec<u8>, TxError> {
        let procedure = self.procedures.get(name)?;
        match (procedure.kind(), self.invoker.get()) {
            (ProcedureKind::Update, Some(invoker)) => {
                let (position, outcome) = invoker.invoke(name, bytes.to_vec())?;
                // The answer may come from another replica (after a re-send): read your writes
                // here once this replica has applied it too (or after the usual wait).
                self.engine
                    .wait_applied(position, Some(Instant::now() + APPLIED_WAIT));
                match outcome {
                    Outcome::Returned(result) => Ok(result),
                    Outcome::Failed(why) => Err(TxError::abort(why)),
                }
            }
            (ProcedureKind::Update, None) => self.atomically(|tx| procedure.call(tx, bytes)),
            (ProcedureKind::ReadOnly, _) => self.atomically_read(|tx| procedure.call(tx, bytes)),
        }
    }

    /// The node's registered procedures.
    pub fn procedures(&self) -> &Procedures {
        &self.procedures
    }

    /// A transaction with options of its own.
    pub fn tx(&self) -> TxBuilder<'_> {
        TxBuilder {
            node: self,
            opts: self.engine.config().default_options.clone(),
        }
    }

    /// A checkpointed transaction over `state`; add steps with [`Steps::step`].
    pub fn steps<'a, S: Clone>(&'a self, state: S) -> Steps<'a, S> {
        Steps {
            node: self,
            opts: self.engine.config().default_options.clone(),
            state,
            steps: Vec::new(),
        }
    }
}

/// Options for one transaction, then the transaction.
pub struct TxBuilder<'n> {
    node: &'n Node,
    opts: TxOptions,
}

impl<'n> TxBuilder<'n> {
    /// Priority under the priority contention manager (higher wins).
    pub fn priority(mut self, p: u16) -> Self {
        self.opts.priority = p;
        self
    }

    /// Give up after this many attempts.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.opts.max_attempts = Some(n);
        self
    }

    /// Give up after this long (also bounds waiting in `retry()`).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.opts.timeout = Some(d);
        self
    }

    /// Use this contention manager.
    pub fn contention(mut self, c: ContentionPolicy) -> Self {
        self.opts.contention = Some(c);
        self
    }

    /// Run as a read-only snapshot.
    pub fn read_only(mut self) -> Self {
        self.opts.read_only = true;
        self
    }

    /// Under a replicated protocol, first wait until this node has applied everything
    /// committed anywhere before the transaction began (see [`TxOptions::linearizable`]).
    pub fn linearizable(mut self) -> Self {
        self.opts.linearizable = true;
        self
    }

    /// Runs the transaction (see [`Node::atomically`]).
    pub fn run<R>(self, f: impl FnMut(&mut Tx<'_>) -> Result<R, TxError>) -> Result<R, TxError> {
        self.node.engine.run(&self.opts, f)
    }

    /// Runs the transaction with the application's error type (see [`Node::try_atomically`]).
    pub fn try_run<R, E: From<TxError>>(
        self,
        f: impl FnMut(&mut Tx<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        self.node.engine.run(&self.opts, f)
    }
}

/// A transaction written as steps over a cloneable state: on a conflict it resumes from the
/// latest step whose earlier reads are still valid instead of restarting.
pub struct Steps<'a, S> {
    node: &'a Node,
    opts: TxOptions,
    state: S,
    steps: Vec<Step<'a, S>>,
}

impl<'a, S: Clone> Steps<'a, S> {
    /// Adds a step; a checkpoint is taken before it.
    pub fn step(mut self, f: impl FnMut(&mut Tx<'_>, &mut S) -> Result<(), TxError> + 'a) -> Self {
        self.steps.push(Box::new(f));
        self
    }

    /// Uses these options for the transaction.
    pub fn options(mut self, opts: TxOptions) -> Self {
        self.opts = opts;
        self
    }

    /// Runs the steps as one transaction and returns the final state.
    pub fn run(mut self) -> Result<S, TxError> {
        self.node
            .engine
            .run_steps(&self.opts, self.state, &mut self.steps)
    }
}
