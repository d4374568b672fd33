//! Where keys' values come from: a configuration file, checked against the settings table
//! (unknown keys, values of the wrong shape), and the environment's variables.

use std::collections::BTreeMap;
use std::path::Path;

use toml::{Spanned, Value};

use super::environment::nearest;
use super::setting::{Kind, Raw};
use super::table::{setting, SETTINGS};
use super::{invalid, ConfigError};

/// The values of the file at `path` by key, each already of its key's shape. Unknown keys
/// and broken TOML are [`ConfigError::Parse`] (with the line); a value of the wrong shape is
/// [`ConfigError::Invalid`] naming its key.
pub(super) fn read_file(path: &Path) -> Result<BTreeMap<String, Raw>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let parse_error = |message: String| ConfigError::Parse {
        path: path.to_path_buf(),
        message,
    };
    let values: BTreeMap<String, Spanned<Value>> =
        toml::from_str(&text).map_err(|e| parse_error(e.to_string().trim_end().to_string()))?;
    let line_of = |offset: usize| {
        let before = &text.as_bytes()[..offset.min(text.len())];
        before.iter().filter(|&&b| b == b'\n').count() + 1
    };
    let mut raws = BTreeMap::new();
    for (key, value) in values {
        let line = line_of(value.span().start);
        let Some(row) = setting(&key) else {
            let keys = SETTINGS.iter().map(|s| s.key);
            let hint = nearest(&key, keys)
                .map(|known| format!(" (did you mean `{known}`?)"))
                .unwrap_or_default();
            return Err(parse_error(format!(
                "line {line}: unknown key `{key}`{hint}; docs/guide/configuration.md lists \
                 every key"
            )));
        };
        let value = value.into_inner();
        let found = value.type_str();
        let raw = from_file(row.kind, value).ok_or_else(|| {
            invalid(
                &key,
                format!(
                    "must be {} (line {line}), not {found}",
                    with_article(row.kind.name())
                ),
            )
        })?;
        raws.insert(key, raw);
    }
    Ok(raws)
}

/// "a string", "an integer", ...
fn with_article(noun: &str) -> String {
    let article = if noun.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    };
    format!("{article} {noun}")
}

/// A file's value as the key's shape wants it, if it has that shape.
fn from_file(kind: Kind, value: Value) -> Option<Raw> {
    match (kind, value) {
        (Kind::Text, Value::String(text)) => Some(Raw::Text(text)),
        (Kind::Integer, Value::Integer(n)) => Some(Raw::Text(n.to_string())),
        (Kind::Boolean, Value::Boolean(b)) => Some(Raw::Text(b.to_string())),
        (Kind::TextList, Value::Array(items)) => items
            .into_iter()
            .map(|item| match item {
                Value::String(text) => Some(text),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .map(Raw::List),
        (Kind::Tables, Value::Array(items)) => items
            .into_iter()
            .map(|item| match item {
                Value::Table(table) => Some(table),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .map(Raw::Tables),
        _ => None,
    }
}

/// A variable's text as the key's shape wants it: a list's items are separated by commas;
/// arrays of tables have forms of their own, parsed by their rows.
pub(super) fn from_variable(kind: Kind, text: String) -> Raw {
    match kind {
        Kind::TextList => Raw::List(text.split(',').map(str::to_string).collect()),
        _ => Raw::Text(text),
    }
}
