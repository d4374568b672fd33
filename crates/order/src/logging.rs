//! raft-rs logs through slog; this bridge sends its records to `tracing` (target `raft`).

use std::fmt::{self, Write as _};

use slog::{Drain, Level, Never, OwnedKVList, Record, Serializer, KV};

struct TracingDrain;

/// Collects a record's key-value pairs as `key=value` text.
struct Pairs(String);

impl Serializer for Pairs {
    fn emit_arguments(&mut self, key: slog::Key, val: &fmt::Arguments<'_>) -> slog::Result {
        let _ = write!(self.0, " {key}={val}");
        Ok(())
    }
}

impl Drain for TracingDrain {
    type Ok = ();
    type Err = Never;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<(), Never> {
        let mut pairs = Pairs(String::new());
        let _ = record.kv().serialize(record, &mut pairs);
        let _ = values.serialize(record, &mut pairs);
        let msg = record.msg();
        let kv = pairs.0;
        match record.level() {
            Level::Critical | Level::Error => tracing::error!(target: "raft", "{msg}{kv}"),
            Level::Warning => tracing::warn!(target: "raft", "{msg}{kv}"),
            Level::Info => tracing::info!(target: "raft", "{msg}{kv}"),
            Level::Debug => tracing::debug!(target: "raft", "{msg}{kv}"),
            Level::Trace => tracing::trace!(target: "raft", "{msg}{kv}"),
        }
        Ok(())
    }
}

/// A slog logger whose records go to `tracing`.
pub fn raft_logger() -> slog::Logger {
    slog::Logger::root(TracingDrain.fuse(), slog::o!())
}
