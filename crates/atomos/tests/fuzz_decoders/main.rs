//! Fuzzing of every decoder a node runs on bytes from a peer, each followed by the state
//! machine that receives the message: the wire frame (`LinkFrame<Envelope<NodeMsg>>`), the TFA
//! and order-layer messages inside it, and the Raft messages and snapshots inside those. The TFA
//! node and the order replica under fuzzing each run among two honest peers, so they have state
//! to get wrong (objects, locks, a log, a leader, snapshots).
//!
//! Inputs are raw bytes, valid encodings with bytes flipped, inserted or cut, and
//! structure-aware messages built by `arbitrary` (then encoded and decoded like any other).
//! Every outcome must be a decode error or a step of the receiving machine; checked: no panic,
//! no input that makes a decode or a step allocate more than 64 MiB, and no change of state
//! from an input the machine refuses (a TFA clock beyond the protocol's bound, a message from a
//! non-member of the order layer, a snapshot that does not decode).
//!
//! The harness (counting heap, generator, mutations, `ATOMOS_FUZZ_*`) is `atomos_sim::fuzz`.
//! `ATOMOS_FUZZ_INPUTS=N` sets the inputs per target (default 20,000);
//! `ATOMOS_FUZZ_SEED=S` the first seed. On demand, ten million inputs:
//! `ATOMOS_FUZZ_INPUTS=10000000 cargo test --release -p atomos --test fuzz_decoders`.

mod order;
mod tfa;
mod wire;

/// Counts the heap, so that an input that makes a decode or a step allocate without bound fails.
#[global_allocator]
static HEAP: atomos_sim::fuzz::CountingHeap = atomos_sim::fuzz::CountingHeap;
