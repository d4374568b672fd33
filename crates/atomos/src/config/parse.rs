//! Parsers of single settings' text, shared by the rows of the settings table: each names the
//! key (or variable) that gave the text when it refuses it.

use std::time::Duration;

use atomos_core::ContentionPolicy;
use atomos_net::transport::is_client;
use atomos_protocols::oss::CommitMode;

use super::{invalid, ConfigError, LogFormat};
use crate::service::Policy;

/// The levels a single-word `log_level` may be.
pub(super) const LOG_LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];

/// Text that must not be blank.
pub(super) fn non_empty(name: &str, text: &str) -> Result<String, ConfigError> {
    if text.trim().is_empty() {
        Err(invalid(name, "must not be empty"))
    } else {
        Ok(text.to_string())
    }
}

/// A member's node id: a whole number below 2^63 (ids above belong to clients).
pub(super) fn node_id(name: &str, text: &str) -> Result<u64, ConfigError> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|&id| !is_client(id))
        .ok_or_else(|| {
            invalid(
                name,
                format!("{text:?} is not a node id (a whole number below 2^63)"),
            )
        })
}

/// `true`/`false` (or `1`/`0` in a variable).
pub(super) fn switch(name: &str, text: &str) -> Result<bool, ConfigError> {
    match text.trim() {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        other => Err(invalid(name, format!("{other:?} is not true or false"))),
    }
}

/// A whole number from `min` to `max` of `what`.
pub(super) fn number_in(
    name: &str,
    text: &str,
    range: std::ops::RangeInclusive<u64>,
    what: &str,
) -> Result<u64, ConfigError> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|n| range.contains(n))
        .ok_or_else(|| {
            let (min, max) = (range.start(), range.end());
            let bounds = if *max == u64::MAX && *min == 0 {
                String::new()
            } else if *max == u64::MAX {
                format!("(at least {min})")
            } else {
                format!("from {min} to {max}")
            };
            let bounds = if bounds.is_empty() {
                bounds
            } else {
                format!(" {bounds}")
            };
            invalid(name, format!("{text:?} is not a number of {what}{bounds}"))
        })
}

/// [`number_in`] as a `usize`.
pub(super) fn count_in(
    name: &str,
    text: &str,
    range: std::ops::RangeInclusive<u64>,
    what: &str,
) -> Result<usize, ConfigError> {
    let n = number_in(name, text, range, what)?;
    usize::try_from(n).map_err(|_| invalid(name, format!("{text:?} is too large")))
}

/// A duration in milliseconds from 1 ms to one hour.
pub(super) fn millis(name: &str, text: &str) -> Result<Duration, ConfigError> {
    number_in(name, text, 1..=3_600_000, "milliseconds").map(Duration::from_millis)
}

/// A duration in microseconds from 0 to one second.
pub(super) fn micros(name: &str, text: &str) -> Result<Duration, ConfigError> {
    number_in(name, text, 0..=1_000_000, "microseconds").map(Duration::from_micros)
}

/// A contention manager's name.
pub(super) fn contention(name: &str, text: &str) -> Result<ContentionPolicy, ConfigError> {
    match text.trim() {
        "abort-self" => Ok(ContentionPolicy::AbortSelf),
        "backoff" => Ok(ContentionPolicy::Backoff),
        "priority" => Ok(ContentionPolicy::Priority),
        other => Err(invalid(
            name,
            format!("{other:?} is not a contention manager (abort-self, backoff, priority)"),
        )),
    }
}

/// The name `contention` gives a contention manager.
pub(super) fn contention_name(policy: ContentionPolicy) -> &'static str {
    match policy {
        ContentionPolicy::AbortSelf => "abort-self",
        ContentionPolicy::Backoff => "backoff",
        ContentionPolicy::Priority => "priority",
    }
}

/// A level, or `tracing` filter directives. A single word must be a level: a misspelt one
/// would read as a module's name.
pub(super) fn log_level(name: &str, text: &str) -> Result<String, ConfigError> {
    let directives = text.contains(['=', ',']);
    let parsed = tracing_subscriber::EnvFilter::builder().parse(text);
    if (directives && parsed.is_ok()) || LOG_LEVELS.contains(&text) {
        Ok(text.to_string())
    } else {
        Err(invalid(
            name,
            format!(
                "{text:?} is neither a level ({}) nor filter directives like \
                 \"info,atomos_order=debug\"",
                LOG_LEVELS.join(", ")
            ),
        ))
    }
}

/// `text` or `json`.
pub(super) fn log_format(name: &str, text: &str) -> Result<LogFormat, ConfigError> {
    match text.trim() {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        other => Err(invalid(name, format!("{other:?} is not text or json"))),
    }
}

/// An `oss` commit mode's name.
pub(super) fn commit_mode(name: &str, text: &str) -> Result<CommitMode, ConfigError> {
    CommitMode::parse(text.trim()).ok_or_else(|| {
        let names: Vec<&str> = CommitMode::NAMES.iter().map(|(n, _)| *n).collect();
        invalid(
            name,
            format!("{text:?} is not a commit mode ({})", names.join(", ")),
        )
    })
}

/// The name `oss_commit` gives a commit mode.
pub(super) fn commit_mode_name(mode: CommitMode) -> &'static str {
    CommitMode::NAMES
        .iter()
        .find(|(_, m)| *m == mode)
        .map_or("?", |(name, _)| name)
}

/// A transaction service's policy (`C_max` at least 1).
pub(super) fn sched(name: &str, text: &str) -> Result<Policy, ConfigError> {
    match text.trim().parse::<Policy>() {
        Ok(p) if p.cmax() == Some(0) => Err(invalid(name, "C_max must be at least 1")),
        Ok(p) => Ok(p),
        Err(e) => Err(invalid(name, e.to_string())),
    }
}

/// A scheduling policy as the `sched` key spells it.
pub(super) fn sched_name(policy: Policy) -> String {
    match policy {
        Policy::Cmax(n) | Policy::Lazy(n) => format!("{}:{n}", policy.name()),
        other => other.name().to_string(),
    }
}
