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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Register {
    values: BTreeMap<String, Vec<u8>>,
    applied: u64,
}

impl Register {
    /// Empty registers.
    pub fn new() -> Register {
        Register::default()
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

    fn snapshot(&self) -> Vec<u8> {
        postcard::to_stdvec(&(&self.values, self.applied)).unwrap_or_default()
    }

    fn restore(&mut self, data: &[u8]) -> Result<(), String> {
        let (values, applied) = Self::decode_snapshot(data)?;
        self.values = values;
        self.applied = applied;
        Ok(())
    }

    fn check_snapshot(&self, data: &[u8]) -> Result<(), String> {
        Self::decode_snapshot(data).map(|_| ())
    }
}
