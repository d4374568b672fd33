//! The seam between atomos protocols and whatever runs them.
//!
//! A protocol is a [`Machine`]: a deterministic value that reacts to one [`Input`] at a time
//! (a message, a timer tick, a local request, a confirmation that its disk writes are durable)
//! by appending [`Output`]s (messages to send, records to persist, deliveries to the layers
//! above, warnings). It reads no clock (the time comes with each input), opens no socket or
//! file, starts no thread and draws no randomness except from a generator seeded through its
//! configuration. One driver runs every machine over real transports, timers and disks
//! (`atomos::driver`); the simulator (`atomos-sim`) runs the same machines over a simulated
//! network and disk with faults.
//!
//! The ordering contract between disk and network is the one the driver and the simulator both
//! keep: **an output that follows an [`Output::Persist`] is carried out only once that write is
//! durable** (for sends and deliveries; later writes simply queue behind it). A machine therefore
//! writes what a message promises before it emits the message, exactly as it would with a
//! synchronous disk, and the driver is free to run the disk on a thread of its own and to group
//! many writes under one fsync. [`Input::Persisted`] tells the machine how far its writes are
//! durable, for machines that want to act on it. [`Gate`] is that rule as drivers keep it.
//!
//! [`wal`] is the write-ahead log's format (a file header naming the format, then records of
//! length, the length's check, checksum and payload), shared by the file disk and the
//! simulated one, with the rule that tells a torn final record (cut) from a corrupt one in the
//! middle (refuse to start) without searching inside a damaged record's payload.

#![deny(missing_docs)]

mod gate;
pub mod wal;

pub use bytes::Bytes;
pub use gate::Gate;

use std::fmt::{Debug, Display};

/// A message type that crosses links between builds of different wire versions (a rolling
/// upgrade). A new kind of message is a new enum variant appended after the others, and says
/// here the wire version that introduced it: a link that speaks an older version does not carry
/// it (see `atomos_net::wire`).
pub trait WireMessage {
    /// The wire version that introduced this message's kind. The default, 0, means every
    /// version a build still speaks has it.
    fn since(&self) -> u16 {
        0
    }
}

impl WireMessage for () {}

/// A node's id: its address in the cluster's transports and its Raft id. Never 0 in a
/// configured cluster.
pub type NodeId = u64;

/// What a machine reacts to.
#[derive(Clone, Debug, PartialEq)]
pub enum Input<M, R> {
    /// A message from another node (or from a local client of this one).
    Message {
        /// The sender.
        from: NodeId,
        /// The message.
        msg: M,
    },
    /// The periodic timer fired.
    Tick,
    /// A local request (from the application on this node).
    Request(R),
    /// Every write the machine emitted, up to and including its `through`-th (counting from 1
    /// since the machine was built), is durable.
    Persisted {
        /// The number of the latest durable write.
        through: u64,
    },
}

/// A disk write. Records are opaque bytes to the disk (the machine encodes them); the disk frames
/// and checksums each one ([`wal`]). A record is shared, not copied: a machine may hand the
/// same large record (a snapshot of its state) to several writes and keep it itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Append these records to the log.
    Append(Vec<Bytes>),
    /// Replace the whole log with these records, atomically.
    Rewrite(Vec<Bytes>),
    /// Replace the whole log with these records, which hold no fact that the writes emitted
    /// before them do not (a compaction): the disk may confirm it at once and write it in the
    /// background while later writes go to the current log, as long as it replaces the log
    /// atomically with these records followed by every write confirmed after it. A crash
    /// before it lands leaves the log that the other writes made.
    Compact(Vec<Bytes>),
}

/// What a machine asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Output<M, D> {
    /// Send `msg` to node `to` (possibly this node itself).
    Send {
        /// The receiver.
        to: NodeId,
        /// The message.
        msg: M,
    },
    /// Write to this node's disk. Sends and deliveries emitted after it wait until it is
    /// durable; the machine hears of it through [`Input::Persisted`].
    Persist(Write),
    /// Hand something to the layers above on this node (an answer, a delivery).
    Deliver(D),
    /// Something an operator should know.
    Warn(String),
}

impl<M, D> Output<M, D> {
    /// The same output with its message passed through `msg` and its delivery through
    /// `deliver` (a wrapper machine re-labelling its inner machine's outputs).
    pub fn map<M2, D2>(
        self,
        msg: impl FnOnce(M) -> M2,
        deliver: impl FnOnce(D) -> D2,
    ) -> Output<M2, D2> {
        match self {
            Output::Send { to, msg: m } => Output::Send { to, msg: msg(m) },
            Output::Persist(write) => Output::Persist(write),
            Output::Deliver(d) => Output::Deliver(deliver(d)),
            Output::Warn(text) => Output::Warn(text),
        }
    }
}

/// A protocol's state machine. Deterministic: the same inputs in the same order give the same
/// outputs, with no I/O of its own.
pub trait Machine {
    /// Messages between nodes.
    type Msg: Clone + Debug;
    /// Local requests.
    type Request: Debug;
    /// What the machine delivers to the layers above.
    type Delivery: Clone + Debug;
    /// Why the machine cannot go on (it must be stopped and restarted from its disk).
    type Error: Display + Debug;

    /// Reacts to `input` at time `now` (in the machine's time unit, from any fixed origin) by
    /// appending outputs to `out`. An error means the machine is no longer usable: the node
    /// must crash-stop (outputs appended before the error are discarded).
    fn step(
        &mut self,
        now: u64,
        input: Input<Self::Msg, Self::Request>,
        out: &mut Vec<Output<Self::Msg, Self::Delivery>>,
    ) -> Result<(), Self::Error>;
}

/// Deterministic numbers for machines and their tests: a seeded generator, a mixing function
/// and a stable hash, the same on every platform and in every build (values derived from them
/// may be stored or compared between replicas).
pub mod stable {
    use std::hash::Hasher;

    use rand_core::{RngCore, SeedableRng};

    /// The seeded generator machines and simulations draw from (SplitMix64). Seeded with
    /// [`SeedableRng::seed_from_u64`], its state is the seed itself.
    pub use rand_xoshiro::SplitMix64;

    /// The golden-ratio increment SplitMix64 steps its state by.
    pub const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

    /// Scrambles `x` (SplitMix64's output function on state `x`): nearby inputs give unrelated
    /// outputs.
    pub fn mix64(x: u64) -> u64 {
        SplitMix64::seed_from_u64(x.wrapping_sub(GOLDEN)).next_u64()
    }

    /// FNV-1a over `bytes`.
    pub fn fnv1a(bytes: &[u8]) -> u64 {
        let mut hasher = fnv::FnvHasher::default();
        hasher.write(bytes);
        hasher.finish()
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// The values the hand-written copies these replace gave: seeds, batch bases, digests
        /// and homes computed before stay the same.
        #[test]
        fn the_sequences_are_the_ones_written_before() {
            fn old_next(state: &mut u64) -> u64 {
                *state = state.wrapping_add(GOLDEN);
                let mut z = *state;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^ (z >> 31)
            }
            fn old_fnv(bytes: &[u8]) -> u64 {
                bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
                    (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
                })
            }
            for seed in [0, 1, 7, GOLDEN, u64::MAX, 0x6a09_e667_f3bc_c908] {
                let (mut old, mut new) = (seed, SplitMix64::seed_from_u64(seed));
                for _ in 0..100 {
                    assert_eq!(old_next(&mut old), new.next_u64());
                }
                let mut state = seed.wrapping_sub(GOLDEN);
                assert_eq!(mix64(seed), old_next(&mut state));
            }
            for text in ["", "a", "acct/17", "atomos_core::cell::Cell<u64>"] {
                assert_eq!(fnv1a(text.as_bytes()), old_fnv(text.as_bytes()));
            }
            assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        }
    }
}
