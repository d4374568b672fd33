//! One configuration key's description: its shape, who reads it, what it means, and how its
//! value is set on a node's settings and shown back.

use toml::{Table, Value};

use super::{ConfigError, NodeSettings};
use crate::node::Protocol;

/// What a key's value looks like in a file (its variable always holds text).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A string.
    Text,
    /// A whole number.
    Integer,
    /// `true` or `false` (`1` or `0` in a variable).
    Boolean,
    /// An array of strings (its variable: items separated by commas).
    TextList,
    /// An array of tables (`[[key]]` sections; its variable has a form of its own).
    Tables,
}

impl Kind {
    /// The name the reference gives this kind.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Text => "string",
            Kind::Integer => "integer",
            Kind::Boolean => "boolean",
            Kind::TextList => "array of strings",
            Kind::Tables => "array of tables",
        }
    }
}

/// Which nodes read a key; a node warns about a key it was given but does not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readers {
    /// Every node.
    Every,
    /// Nodes running `tfa`.
    Tfa,
    /// Nodes running `oss`.
    Oss,
    /// Nodes whose commits wait for a verdict: `certify`, `active`, `oss`.
    CommitWaiters,
    /// Nodes with a write-ahead log: every protocol but `local`, and `order = true`.
    Logs,
    /// Nodes whose order replica compacts its log: `certify`, `active`, and `order = true`.
    Snapshots,
    /// Nodes with a replicated log: `certify`, `active`, `oss`, and `order = true`.
    Replicas,
}

impl Readers {
    /// Whether a node with these settings reads the key.
    pub fn read_by(self, s: &NodeSettings) -> bool {
        match self {
            Readers::Every => true,
            Readers::Tfa => s.protocol == Protocol::Tfa,
            Readers::Oss => s.protocol == Protocol::Oss,
            Readers::CommitWaiters => s.protocol.is_ordered() || s.protocol == Protocol::Oss,
            Readers::Logs => s.order || s.protocol != Protocol::Local,
            Readers::Snapshots => s.order || s.protocol.is_ordered(),
            Readers::Replicas => s.order || s.protocol.is_replicated(),
        }
    }

    /// Who reads the key, as the reference says it.
    pub fn describe(self) -> &'static str {
        match self {
            Readers::Every => "every node",
            Readers::Tfa => "`tfa`",
            Readers::Oss => "`oss`",
            Readers::CommitWaiters => "`certify`, `active`, `oss`",
            Readers::Logs => "every protocol but `local`; `order = true`",
            Readers::Snapshots => "`certify`, `active`; `order = true`",
            Readers::Replicas => "`certify`, `active`, `oss`; `order = true`",
        }
    }
}

/// A key's value as its source gave it: a file's value already of the key's [`Kind`]
/// (numbers and booleans as their text), or a variable's text.
#[derive(Debug)]
pub(super) enum Raw {
    /// One value's text.
    Text(String),
    /// A file's array of strings, or a variable's items.
    List(Vec<String>),
    /// A file's array of tables.
    Tables(Vec<Table>),
}

impl Raw {
    /// The text of a one-valued key (a source never gives such a key another shape).
    pub(super) fn text(&self) -> &str {
        match self {
            Raw::Text(text) => text,
            Raw::List(_) | Raw::Tables(_) => "",
        }
    }

    /// The items of a list-valued key.
    pub(super) fn list(self) -> Vec<String> {
        match self {
            Raw::List(items) => items,
            Raw::Text(text) => vec![text],
            Raw::Tables(_) => Vec::new(),
        }
    }
}

/// Sets a key's value on the settings, or refuses it naming the key (or variable) given.
pub(super) type Apply = fn(&mut NodeSettings, &str, Raw) -> Result<(), ConfigError>;

/// A key's value in the settings as a file would hold it (`None`: not set, or never shown).
pub(super) type Show = fn(&NodeSettings) -> Option<Value>;

/// One configuration key.
pub struct Setting {
    /// The key in a configuration file.
    pub key: &'static str,
    /// The shape of its value in a file.
    pub kind: Kind,
    /// Which nodes read it.
    pub readers: Readers,
    /// What it means, for the reference.
    pub meaning: &'static str,
    /// The default, when the defaults' value does not say it (derived, machine-dependent, or
    /// unset).
    pub default_note: Option<&'static str>,
    pub(super) apply: Apply,
    pub(super) show: Show,
}

impl Setting {
    /// The environment variable that overrides the key: `ATOMOS_` and the key in capitals.
    pub fn variable(&self) -> String {
        format!("ATOMOS_{}", self.key.to_ascii_uppercase())
    }

    /// Sets the value `raw`, given by `name` (the key or its variable), on `settings`.
    pub(super) fn apply(
        &self,
        settings: &mut NodeSettings,
        name: &str,
        raw: Raw,
    ) -> Result<(), ConfigError> {
        (self.apply)(settings, name, raw)
    }

    /// The value in `settings`, as a file would hold it.
    pub fn show(&self, settings: &NodeSettings) -> Option<Value> {
        (self.show)(settings)
    }
}
