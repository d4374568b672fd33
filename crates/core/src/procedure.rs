//! Procedures: named transactions with typed arguments and results, registered once and
//! invoked by name.
//!
//! A procedure's arguments and result travel as MessagePack with field names (a field added
//! to an argument type with a default reads invocations logged before), so the same invocation can run
//! on the caller's node or be shipped to other replicas and run there (the `active` protocol
//! runs every update procedure on every replica, in one order). That asks two things of a
//! procedure's body:
//!
//! - **It is deterministic**: the same arguments over the same state give the same writes and
//!   the same result. It reads no clock, draws no random number and asks nothing of the world
//!   outside its transaction; whatever varies (a timestamp, a random choice) comes in with the
//!   arguments.
//! - **It may be run more than once**: like any transaction it is re-run on a conflict, so its
//!   only effects are its transactional writes and its result.
//! - **It only reads and writes** when it runs on every replica (under `active`): new
//!   anonymous objects, abstract locks, open nesting and on-commit or on-abort actions fail it
//!   with [`TxError::NotInProcedure`](crate::TxError::NotInProcedure).

use std::any::type_name;
use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::TxError;
use crate::tx::Tx;

/// Whether a procedure writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProcedureKind {
    /// It may write: it runs as an update transaction.
    Update,
    /// It only reads: it runs as a read-only transaction (a snapshot, never aborted), and a
    /// write inside it fails with [`TxError::WriteInReadOnly`].
    ReadOnly,
}

/// A procedure's body with its types erased: encoded arguments in, encoded result out.
type Body = dyn Fn(&mut Tx<'_>, &[u8]) -> Result<Vec<u8>, TxError> + Send + Sync;

/// One registered procedure. Cheap to clone.
#[derive(Clone)]
pub struct Procedure {
    name: Arc<str>,
    kind: ProcedureKind,
    arguments: &'static str,
    result: &'static str,
    body: Arc<Body>,
}

impl std::fmt::Debug for Procedure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Procedure")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("arguments", &self.arguments)
            .field("result", &self.result)
            .finish()
    }
}

impl Procedure {
    /// The name it was registered under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether it writes.
    pub fn kind(&self) -> ProcedureKind {
        self.kind
    }

    /// Runs the body in `tx` on encoded arguments and returns its encoded result. Arguments
    /// that do not decode as the registered type fail with [`TxError::ProcedureTypes`] and
    /// run nothing.
    pub fn call(&self, tx: &mut Tx<'_>, arguments: &[u8]) -> Result<Vec<u8>, TxError> {
        (self.body)(tx, arguments)
    }

    /// Fails with [`TxError::ProcedureTypes`] unless `A` and `R` are the argument and result
    /// types it was registered with.
    pub fn check_types<A: ?Sized, R>(&self) -> Result<(), TxError> {
        let (a, r) = (type_name::<A>(), type_name::<R>());
        if a == self.arguments && r == self.result {
            return Ok(());
        }
        Err(TxError::ProcedureTypes {
            name: self.name.to_string(),
            reason: format!(
                "invoked with arguments {a} and result {r}, registered with arguments {} and \
                 result {}",
                self.arguments, self.result
            ),
        })
    }
}

/// Why a procedure could not be registered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// A procedure of that name is registered already (a body is never replaced: replicas
    /// running different bodies under one name would diverge).
    #[error("a procedure named {0:?} is registered already")]
    Taken(String),
}

/// Procedures by name. Cloning gives another handle to the same registry.
#[derive(Clone, Default)]
pub struct Procedures {
    map: Arc<RwLock<HashMap<Arc<str>, Procedure>>>,
}

impl Procedures {
    /// An empty registry.
    pub fn new() -> Procedures {
        Procedures::default()
    }

    /// Registers `body` under `name`. Each attempt decodes the arguments (`A`) and lends them
    /// to the body; the result (`R`) is encoded when the body returns. See the module
    /// documentation for what a body must keep to.
    pub fn register<A, R, F>(
        &self,
        name: &str,
        kind: ProcedureKind,
        body: F,
    ) -> Result<(), RegisterError>
    where
        A: DeserializeOwned + 'static,
        R: Serialize + 'static,
        F: Fn(&mut Tx<'_>, &A) -> Result<R, TxError> + Send + Sync + 'static,
    {
        let name: Arc<str> = Arc::from(name);
        let for_errors = name.clone();
        let erased = move |tx: &mut Tx<'_>, bytes: &[u8]| -> Result<Vec<u8>, TxError> {
            let args: A =
                crate::codec::from_portable(bytes).map_err(|e| TxError::ProcedureTypes {
                    name: for_errors.to_string(),
                    reason: format!("arguments do not decode as {}: {e}", type_name::<A>()),
                })?;
            let result = body(tx, &args)?;
            crate::codec::to_portable(&result).map_err(|e| TxError::ProcedureTypes {
                name: for_errors.to_string(),
                reason: format!("result does not encode: {e}"),
            })
        };
        let procedure = Procedure {
            name: name.clone(),
            kind,
            arguments: type_name::<A>(),
            result: type_name::<R>(),
            body: Arc::new(erased),
        };
        let mut map = self.map.write();
        if map.contains_key(&name) {
            return Err(RegisterError::Taken(name.to_string()));
        }
        map.insert(name, procedure);
        Ok(())
    }

    /// The procedure registered under `name`, or [`TxError::NoSuchProcedure`].
    pub fn get(&self, name: &str) -> Result<Procedure, TxError> {
        self.map
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| TxError::NoSuchProcedure {
                name: name.to_string(),
            })
    }

    /// The registered names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.map.read().keys().map(|k| k.to_string()).collect();
        names.sort_unstable();
        names
    }
}

/// Encodes a procedure's arguments for [`Procedure::call`].
pub fn encode_arguments<A: Serialize + ?Sized>(name: &str, args: &A) -> Result<Vec<u8>, TxError> {
    crate::codec::to_portable(args).map_err(|e| TxError::ProcedureTypes {
        name: name.to_string(),
        reason: format!("arguments do not encode: {e}"),
    })
}

/// Decodes a procedure's encoded result.
pub fn decode_result<R: DeserializeOwned>(name: &str, bytes: &[u8]) -> Result<R, TxError> {
    crate::codec::from_portable(bytes).map_err(|e| TxError::ProcedureTypes {
        name: name.to_string(),
        reason: format!("result does not decode as {}: {e}", type_name::<R>()),
    })
}
