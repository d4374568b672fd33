//! A tiny replicated state machine for tests and examples: named registers of bytes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::types::{Request, StateMachine};

/// What a register request asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RegisterOp {
    /// Set `key` to `value`; answers the previous value.
    Put {
        /// The register.
        key: String,
        /// Its new value.
        value: Vec<u8>,
    },
    /// Answers the value of `key`.
    Get {
        /// The register.
        key: String,
    },
    /// Appends `value` to `key`'s bytes; answers the new length.
    Append {
        /// The register.
        key: String,
        /// Bytes to append.
        value: Vec<u8>,
    },
}

impl RegisterOp {
    /// The request payload for this operation.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).unwrap_or_default()
    }
}

/// Registers of bytes by name. A payload that is not a [`RegisterOp`] is answered with an empty
/// answer and changes nothing.
///
/// It also checks what a speculating machine relies on: every finally applied request is the
/// one the entry's latest unrevoked optimistic delivery named at that index (see
/// [`Register::speculation`]). Equality compares the registers only.
#[derive(Clone, Debug, Default)]
pub struct Register {
    values: BTreeMap<String, Vec<u8>>,
    applied: u64,
    /// Optimistic deliveries not yet final.
    opt: BTreeMap<u64, Vec<Request>>,
    /// Final requests that matched their optimistic delivery, and those that did not.
    matched: u64,
    mismatched: u64,
    /// Snapshots are encoded off the replica's thread ([`Register::encoding_later`]).
    later: bool,
}

impl PartialEq for Register {
    fn eq(&self, other: &Register) -> bool {
        (&self.values, self.applied) == (&other.values, other.applied)
    }
}

impl Eq for Register {}

impl Register {
    /// Empty registers.
    pub fn new() -> Register {
        Register::default()
    }

    /// Empty registers whose snapshots the host encodes off the replica's thread, as the
    /// replicated store's are (see [`StateMachine::snapshot_later`]): the values are copied
    /// when the snapshot is asked for and encoded by the job.
    pub fn encoding_later() -> Register {
        Register {
            later: true,
            ..Register::default()
        }
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&[u8]> {
        self.values.get(key).map(Vec::as_slice)
    }

    fn decode_snapshot(data: &[u8]) -> Result<(BTreeMap<String, Vec<u8>>, u64), String> {
        postcard::from_bytes(data).map_err(|e| e.to_string())
    }

    /// Requests applied (malformed ones included).
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// Finally applied requests that were what their entry's optimistic delivery named at
    /// that index, and those that were not (a replica must never produce the second).
    pub fn speculation(&self) -> (u64, u64) {
        (self.matched, self.mismatched)
    }
}

impl StateMachine for Register {
    fn apply(&mut self, request: &Request) -> Vec<u8> {
        self.applied += 1;
        match postcard::from_bytes::<RegisterOp>(&request.payload) {
            Ok(RegisterOp::Put { key, value }) => {
                self.values.insert(key, value).unwrap_or_default()
            }
            Ok(RegisterOp::Get { key }) => self.values.get(&key).cloned().unwrap_or_default(),
            Ok(RegisterOp::Append { key, value }) => {
                let v = self.values.entry(key).or_default();
                v.extend_from_slice(&value);
                (v.len() as u64).to_be_bytes().to_vec()
            }
            Err(_) => Vec::new(),
        }
    }

    fn apply_final(&mut self, seq: u64, index: u32, request: &Request) -> Vec<u8> {
        match self.opt.get(&seq).and_then(|r| r.get(index as usize)) {
            Some(r) if r == request => self.matched += 1,
            _ => self.mismatched += 1,
        }
        if self
            .opt
            .get(&seq)
            .is_some_and(|r| index as usize + 1 >= r.len())
        {
            self.opt.remove(&seq);
        }
        self.apply(request)
    }

    fn optimistic(&mut self, seq: u64, requests: &[Request]) {
        if !requests.is_empty() {
            self.opt.insert(seq, requests.to_vec());
        }
    }

    fn revoked(&mut self, from: u64) {
        self.opt.split_off(&from);
    }

    fn snapshot(&self) -> Vec<u8> {
        postcard::to_stdvec(&(&self.values, self.applied)).unwrap_or_default()
    }

    fn snapshot_later(&self) -> Option<crate::SnapshotJob> {
        if !self.later {
            return None;
        }
        let (values, applied) = (self.values.clone(), self.applied);
        Some(Box::new(move || {
            postcard::to_stdvec(&(&values, applied)).unwrap_or_default()
        }))
    }

    fn restore(&mut self, data: &[u8]) -> Result<(), String> {
        let (values, applied) = Self::decode_snapshot(data)?;
        self.values = values;
        self.applied = applied;
        self.opt.clear();
        Ok(())
    }

    fn check_snapshot(&self, data: &[u8]) -> Result<(), String> {
        Self::decode_snapshot(data).map(|_| ())
    }
}
