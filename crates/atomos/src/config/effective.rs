//! The effective configuration, written back as the TOML a file would hold.

use toml::Table;

use super::{NodeSettings, SETTINGS};

/// `settings` as a configuration file that gives the same node: every key with its value, the
/// defaults included. The secret is never written: a comment says whether one is set. The
/// key file is named, and this node's public key said in a comment.
pub fn effective_toml(settings: &NodeSettings) -> String {
    let mut table = Table::new();
    for row in SETTINGS.iter() {
        if let Some(value) = row.show(settings) {
            table.insert(row.key.to_string(), value);
        }
    }
    let secret = if settings.secret.is_some() {
        "# secret: set (not shown)\n"
    } else {
        "# secret: not set\n"
    };
    let key = match &settings.key {
        Some(key) => format!("# this node's public key: {}\n", key.public()),
        None => "# this node's key: none (a node alone makes one at start)\n".to_string(),
    };
    format!("{secret}{key}{table}")
}
