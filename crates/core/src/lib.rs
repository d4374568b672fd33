//! The per-node transactional engine of atomos.
//!
//! Objects live in cells with a versioned lock and a chain of committed versions. Transactions
//! are opaque and time-based (LSA/TL2 style): a node version clock, reads validated by version
//! with lazy snapshot extension, commit-time locking of the write set and read-set validation.
//! Read-only transactions read a multi-version snapshot and never abort; old versions are
//! reclaimed once no running snapshot can see them. Closed nesting, checkpoints and open nesting
//! give partial rollback and early release. Nothing here performs I/O.

#![deny(missing_docs)]

mod attempts;
mod cell;
mod codec;
mod contention;
mod engine;
mod error;
pub mod history;
mod hot_spots;
mod key;
mod linked;
mod nesting;
mod object;
mod open;
mod ordered;
mod pool;
mod procedure;
mod remote;
mod retry;
mod slots;
mod speculative;
mod stats;
mod store;
mod tref;
mod tx;
mod urgent;
mod value;
mod version;

pub use atomos_derive::Object;
pub use codec::value_refs;
pub use contention::ContentionPolicy;
pub use engine::{Engine, EngineConfig, TxOptions};
pub use error::{Message, TxError};
pub use key::Key;
pub use linked::{Deferred, LinkBase};
pub use nesting::Step;
pub use object::{Object, StoredName};
pub use ordered::{
    Certification, Certifier, CertifyError, LockOutcome, PinnedView, SnapshotObject,
    SnapshotObjectRef, Verdict,
};
pub use procedure::{
    decode_result, encode_arguments, Procedure, ProcedureKind, Procedures, RegisterError,
};
pub use remote::{RemoteAttempt, RemoteError, RemoteSource};
pub use speculative::{ExecutorStats, Invocation, Outcome, SerialExecutor, Slot};
pub use stats::{AbortCause, AbortCounts, Stats};
pub use tref::TRef;
pub use tx::Tx;
pub use value::{Value, ValueError};
