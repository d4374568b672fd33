//! What a simulation is given and gives back: its settings and faults, what a (re)starting node
//! is handed, and the run it produced.

use atomos_seam::NodeId;

/// What a (re)starting node gets: who it is, how many times it started before, and the
/// records its disk holds (a torn final record already cut).
#[derive(Clone, Debug)]
pub struct Boot {
    /// The node (1..=nodes).
    pub node: NodeId,
    /// How many times this node started before (0 the first time).
    pub incarnation: u64,
    /// The durable records on its disk, in order.
    pub log: Vec<Vec<u8>>,
    /// Its disk was wiped at some crash before this start (an operator restarts such a node
    /// telling it so, and may leave the setting on from then on).
    pub wiped: bool,
}

/// Builds a node's machine when it (re)starts, or says why it refuses to (it then stays down).
pub type BootFn<M> = Box<dyn FnMut(Boot) -> Result<M, String>>;

/// Fault rates. Probabilities are per message (loss, duplication), per node and tick (crash),
/// per tick (partition) or per disk write (failing fsync).
#[derive(Clone, Debug)]
pub struct Faults {
    /// Probability that a message is lost.
    pub drop: f64,
    /// Probability that a message is delivered twice.
    pub duplicate: f64,
    /// Messages take 1..=`max_delay` time units (so they overtake each other).
    pub max_delay: u64,
    /// Probability per tick that a partition starts (when none is active).
    pub partition: f64,
    /// How long a partition lasts.
    pub partition_len: u64,
    /// Probability per node and tick that the node crashes.
    pub crash: f64,
    /// How long a crashed node stays down.
    pub down_for: u64,
    /// A disk write becomes durable 1..=`sync_delay` time units after it is issued (in order).
    pub sync_delay: u64,
    /// Probability per disk write that the disk stalls: the write (and every later one, since
    /// writes sync in order) takes `stall_len` time units more. A node whose disk stalls keeps
    /// sending what does not wait for it, so it may run ahead of its own durable state.
    pub stall: f64,
    /// How long a stall lasts.
    pub stall_len: u64,
    /// Probability, at a crash, that part of the first unsynced write reached the disk (a torn
    /// final record).
    pub torn: f64,
    /// Probability per disk write that its fsync fails: the node crash-stops, as its driver
    /// would, and restarts from what was durable.
    pub fsync_fail: f64,
    /// Probability per crash that a durable record in the middle of the node's log is damaged
    /// (the node must then refuse to start) ...
    pub corrupt: f64,
    /// ... on at most this many nodes per run.
    pub max_corrupt_nodes: usize,
    /// Probability per crash that the node's whole disk is lost (it restarts with an empty
    /// log, as after its data directory was wiped) ...
    pub wipe: f64,
    /// ... on at most this many nodes per run.
    pub max_wiped_nodes: usize,
}

impl Faults {
    /// No faults; messages take one time unit; disk writes are durable after one.
    pub fn none() -> Faults {
        Faults {
            drop: 0.0,
            duplicate: 0.0,
            max_delay: 1,
            partition: 0.0,
            partition_len: 0,
            crash: 0.0,
            down_for: 0,
            sync_delay: 1,
            stall: 0.0,
            stall_len: 0,
            torn: 0.0,
            fsync_fail: 0.0,
            corrupt: 0.0,
            max_corrupt_nodes: 0,
            wipe: 0.0,
            max_wiped_nodes: 0,
        }
    }

    /// Every kind of network fault and crash, at rates that keep a small cluster making
    /// progress; disks lose unsynced writes and tear them, and fsyncs fail now and then.
    /// No disk is damaged in the middle (set [`Faults::corrupt`] for that).
    pub fn harsh() -> Faults {
        Faults {
            drop: 0.05,
            duplicate: 0.05,
            max_delay: 30,
            partition: 0.02,
            partition_len: 200,
            crash: 0.01,
            down_for: 100,
            sync_delay: 10,
            stall: 0.0,
            stall_len: 0,
            torn: 0.3,
            fsync_fail: 0.001,
            corrupt: 0.0,
            max_corrupt_nodes: 0,
            wipe: 0.0,
            max_wiped_nodes: 0,
        }
    }
}

impl Faults {
    /// [`Faults::harsh`] on disks that stall: one write in ten (and those after it) takes 300
    /// time units more, so a node runs well ahead of its own durable log.
    pub fn stalling() -> Faults {
        Faults {
            stall: 0.1,
            stall_len: 300,
            ..Faults::harsh()
        }
    }
}

/// One simulation's settings.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The seed of every random choice.
    pub seed: u64,
    /// Number of nodes; they are numbered 1..=nodes.
    pub nodes: usize,
    /// Nodes 1..=`crashable` may crash (the others, clients for example, never do).
    pub crashable: usize,
    /// Time units between ticks.
    pub tick_every: u64,
    /// Faults are injected until this time.
    pub fault_until: u64,
    /// Then the network heals, crashed nodes restart, and the run goes on this long.
    pub settle: u64,
    /// The faults.
    pub faults: Faults,
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct Run<D> {
    /// The seed.
    pub seed: u64,
    /// Every event in the order processed, one line each.
    pub trace: Vec<String>,
    /// What the machines delivered: (time, node, delivery).
    pub notes: Vec<(u64, NodeId, D)>,
    /// Machine errors (each crash-stopped its node): (time, node, error).
    pub failures: Vec<(u64, NodeId, String)>,
    /// Every crash, whatever its cause: (time, node).
    pub crashes: Vec<(u64, NodeId)>,
    /// Nodes that refused to start: (time, node, why).
    pub refused: Vec<(u64, NodeId, String)>,
    /// Nodes whose log was damaged in the middle: (time, node).
    pub corrupted: Vec<(u64, NodeId)>,
    /// Nodes whose disk was wiped: (time, node).
    pub wiped: Vec<(u64, NodeId)>,
    /// Crashes that left a torn final record.
    pub torn: usize,
    /// Failed fsyncs.
    pub failed_fsyncs: usize,
}

impl<D> Run<D> {
    /// A run that has produced nothing yet.
    pub(crate) fn empty(seed: u64) -> Run<D> {
        Run {
            seed,
            trace: Vec::new(),
            notes: Vec::new(),
            failures: Vec::new(),
            crashes: Vec::new(),
            refused: Vec::new(),
            corrupted: Vec::new(),
            wiped: Vec::new(),
            torn: 0,
            failed_fsyncs: 0,
        }
    }
}
