//! The errors a transaction can end with.

use std::fmt;

use crate::key::Key;

/// Why a transaction did not commit, as seen by the code that ran it.
///
/// [`TxError::Conflict`] and [`TxError::Retry`] are signals: an operation returns them so the
/// closure can stop early with `?`, and the engine then re-runs the transaction. They reach the
/// caller of `atomically` only wrapped in [`TxError::RetryBudgetExhausted`] or
/// [`TxError::Timeout`]. Every other variant aborts the transaction (nothing it wrote becomes
/// visible) and is returned to the caller unchanged, without a re-run.
#[derive(Debug, thiserror::Error)]
pub enum TxError {
    /// The object does not exist (never created, or deleted).
    #[error("object {key} does not exist")]
    NotFound {
        /// The missing object's key.
        key: Key,
    },
    /// `create` named an object that already exists.
    #[error("object {key} already exists")]
    AlreadyExists {
        /// The existing object's key.
        key: Key,
    },
    /// The object holds a value of another type than the reference asked for.
    #[error("object {key} does not hold a value of type {expected}")]
    WrongType {
        /// The object's key.
        key: Key,
        /// The type the reference asked for.
        expected: &'static str,
    },
    /// The object holds a value of the right stored name that no longer decodes as its type:
    /// the type changed in a way older values cannot follow (see the upgrade rules in
    /// `docs/guide/stored-types.md`), or the stored bytes are damaged.
    #[error("object {key} holds a value that does not decode: {reason}")]
    Undecodable {
        /// The object's key.
        key: Key,
        /// The stored name and the decoder's complaint.
        reason: String,
    },
    /// Two Rust types of the program declare the same stored name, so values of one would be
    /// read as the other. Nothing was read or written under it.
    #[error(
        "the stored name {name} is declared by two types, {first} and {second}: give each its \
         own name"
    )]
    NameClash {
        /// The canonical stored name.
        name: String,
        /// The type that used the name first.
        first: &'static str,
        /// The type that used it second.
        second: &'static str,
    },
    /// A write was attempted in a transaction declared read-only.
    #[error("write to {key} inside a read-only transaction")]
    WriteInReadOnly {
        /// The object that was to be written.
        key: Key,
    },
    /// The transaction conflicted with another one and will be re-run (a signal; see above).
    #[error("transaction conflict; it will be re-run")]
    Conflict,
    /// The transaction asked to wait for a change of what it read (a signal; see above).
    #[error("transaction waits for a change of what it read")]
    Retry,
    /// The transaction was re-run as often as its retry budget allows and never committed.
    #[error("transaction gave up after {attempts} attempts")]
    RetryBudgetExhausted {
        /// How many attempts were made.
        attempts: u32,
    },
    /// The transaction's time limit passed before it committed.
    #[error("transaction timed out after {attempts} attempts")]
    Timeout {
        /// How many attempts were made.
        attempts: u32,
    },
    /// The node holding the object did not answer in time (it is down or cut off). If it
    /// crashed, the objects it owned are lost: protocols without replication keep one copy.
    #[error(
        "object {key} is unavailable: node {node} did not answer (if it crashed, the objects \
         it owned are lost)"
    )]
    Unavailable {
        /// The object.
        key: Key,
        /// The node that did not answer.
        node: u64,
    },
    /// The object was lost with a node that crashed holding it (protocols without
    /// replication keep one copy). It is not re-created silently: a write to the key fails
    /// the same way.
    #[error(
        "object {key} was lost with node {node}: that node restarted or stopped answering \
         while it held the object, and this protocol keeps one copy"
    )]
    Lost {
        /// The object.
        key: Key,
        /// The node it was lost with.
        node: u64,
    },
    /// The commit was sent to be ordered, and its outcome is unknown: the node lost the
    /// cluster (or stopped) before the verdict came. The transaction may have committed; it
    /// is not re-run, so that it is never applied twice. Read the state to find out.
    #[error(
        "the transaction's outcome is unknown: {reason}; it may have committed, and it was not \
         re-run"
    )]
    OutcomeUnknown {
        /// What happened.
        reason: String,
        /// The request's ticket at the node that sent it, if the node can be asked what became
        /// of it (`NodeRuntime::outcome` under `certify` and `active`).
        ticket: Option<u64>,
    },
    /// The node could not reach a majority of its cluster in time (a linearizable
    /// transaction's barrier was not ordered, or not applied here). Nothing was changed.
    #[error("the cluster is unavailable: {reason}")]
    ClusterUnavailable {
        /// What happened.
        reason: String,
    },
    /// No procedure of that name is registered on the node.
    #[error("no procedure named {name:?} is registered")]
    NoSuchProcedure {
        /// The name invoked.
        name: String,
    },
    /// A procedure was invoked with other argument or result types than it was registered
    /// with, or its encoded arguments did not decode. Nothing ran.
    #[error("procedure {name:?}: {reason}")]
    ProcedureTypes {
        /// The procedure.
        name: String,
        /// What did not match.
        reason: String,
    },
    /// `what` cannot be used inside a procedure that runs on every replica (under `active`):
    /// new anonymous objects, abstract locks, open nesting and on-commit or on-abort actions
    /// would happen once per replica, or differently on each. The procedure wrote nothing.
    #[error("{what} cannot be used inside a procedure run on every replica")]
    NotInProcedure {
        /// The operation.
        what: String,
    },
    /// The protocol will never commit this transaction as it is (under `oss`: it touches
    /// keys of more than one consistency domain). Nothing was changed, and it was not re-run.
    #[error("the transaction cannot commit under this protocol: {reason}")]
    Refused {
        /// Why.
        reason: String,
    },
    /// An error of the application's own, which aborted the transaction.
    #[error("{0}")]
    User(Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl TxError {
    /// The error reading `key` as a `T` ended with.
    pub(crate) fn from_codec<T>(key: &Key, e: crate::codec::CodecError) -> TxError {
        use crate::codec::CodecError;
        match e {
            CodecError::OtherType { .. } => TxError::WrongType {
                key: key.clone(),
                expected: std::any::type_name::<T>(),
            },
            CodecError::NameClash {
                name,
                first,
                second,
            } => TxError::NameClash {
                name,
                first,
                second,
            },
            e @ (CodecError::Undecodable { .. } | CodecError::Unencodable { .. }) => {
                TxError::Undecodable {
                    key: key.clone(),
                    reason: e.to_string(),
                }
            }
        }
    }

    /// The error writing `key`'s value ended with, as the transaction that wrote it fails.
    pub(crate) fn from_encoding(key: &Key, e: crate::codec::CodecError) -> TxError {
        match e {
            // A clash reads the same whichever way the value went.
            e @ crate::codec::CodecError::NameClash { .. } => TxError::from_codec::<()>(key, e),
            e => TxError::abort(format!("cannot encode {key}: {e}")),
        }
    }

    /// Wraps an application error so that `?` can return it from a transaction.
    pub fn user<E: std::error::Error + Send + Sync + 'static>(e: E) -> TxError {
        TxError::User(Box::new(e))
    }

    /// An application error from a message.
    pub fn abort(message: impl Into<String>) -> TxError {
        TxError::User(Box::new(Message(message.into())))
    }

    /// Whether this error is a re-run signal rather than an outcome.
    pub fn is_signal(&self) -> bool {
        matches!(self, TxError::Conflict | TxError::Retry)
    }
}

/// A plain-text application error made by [`TxError::abort`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message(pub String);

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Message {}
