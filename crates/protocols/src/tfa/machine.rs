//! The TFA node behind the protocol seam ([`atomos_seam::Machine`]): the application's calls
//! become [`TfaRequest`]s, its answers [`Answer`] deliveries.

use std::convert::Infallible;

use atomos_core::Key;
use atomos_seam::{Input, Machine};

use super::msg::TfaMsg;
use super::node::{Action, Answer, TfaNode};

/// What the application asks of its node, for its transaction `h` (a handle it picks, unique
/// among its running transactions).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TfaRequest {
    /// Start transaction `h` at the node's clock.
    Begin {
        /// The transaction.
        h: u64,
    },
    /// Read `key`; answered by a [`super::Reply::Read`].
    Read {
        /// The transaction.
        h: u64,
        /// The object.
        key: Key,
    },
    /// Read `key` to write it; answered by a [`super::Reply::Read`] (see
    /// [`TfaNode::read_for_write`]).
    ReadForWrite {
        /// The transaction.
        h: u64,
        /// The object.
        key: Key,
    },
    /// Commit with these buffered writes (`None` deletes); answered by a
    /// [`super::Reply::Commit`].
    Commit {
        /// The transaction.
        h: u64,
        /// The writes.
        writes: Vec<(Key, Option<Vec<u8>>)>,
    },
    /// Drop these reads (a nested block or step that made them is re-run).
    Forget {
        /// The transaction.
        h: u64,
        /// The reads to drop.
        keys: Vec<Key>,
    },
    /// Take abstract lock `name` for `family`; answered by a [`super::Reply::Abstract`].
    AbstractLock {
        /// The transaction asking.
        h: u64,
        /// The family (top-level transaction) that will hold it.
        family: u64,
        /// The lock's name.
        name: String,
    },
    /// The family ended: release its abstract locks.
    ReleaseAbstract {
        /// The family.
        family: u64,
        /// The locks it holds.
        names: Vec<String>,
    },
    /// Abort transaction `h` (its locks and requests are dropped).
    Abort {
        /// The transaction.
        h: u64,
    },
}

impl Machine for TfaNode {
    type Msg = TfaMsg;
    type Request = TfaRequest;
    type Delivery = Answer;
    type Error = Infallible;

    fn step(
        &mut self,
        now: u64,
        input: Input<TfaMsg, TfaRequest>,
        out: &mut Vec<Action>,
    ) -> Result<(), Infallible> {
        // This run's incarnation goes to disk before anything the step sends.
        self.start(now, out);
        match input {
            Input::Message { from, msg } => self.on_message(now, from, msg, out),
            Input::Tick => self.tick(now, out),
            // What waited for the write was held back by the driver's gate.
            Input::Persisted { .. } => {}
            Input::Request(r) => match r {
                TfaRequest::Begin { h } => self.begin(h),
                TfaRequest::Read { h, key } => self.read(now, h, key, out),
                TfaRequest::ReadForWrite { h, key } => self.read_for_write(now, h, key, out),
                TfaRequest::Commit { h, writes } => self.commit(now, h, writes, out),
                TfaRequest::Forget { h, keys } => self.forget(h, &keys),
                TfaRequest::AbstractLock { h, family, name } => {
                    self.abstract_lock(now, h, family, name, out)
                }
                TfaRequest::ReleaseAbstract { family, names } => {
                    self.release_abstract(family, names, out)
                }
                TfaRequest::Abort { h } => self.abort(now, h, out),
            },
        }
        Ok(())
    }
}
