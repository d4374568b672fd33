//! A client's configuration file: how a program that is no member reaches a cluster.
//!
//! ```toml
//! cluster = "prod"
//! secret = "..."              # the cluster secret
//! key_file = "client.key"     # this client's key pair; the members list its public key
//! resend_after_ms = 500       # optional
//! limit_ms = 10000            # optional
//!
//! [[members]]
//! id = 1
//! address = "10.0.0.1:7401"
//! public_key = "..."          # a list of keys while the member rotates its key
//! ```
//!
//! `atomos cluster up` writes one (`client.toml`) with a client key the members admit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::values::OneOrMany;
use super::values::{address, public_keys};
use super::{invalid, read_key_file, ConfigError, MIN_SECRET_BYTES};
use crate::client::ClientConfig;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientFile {
    cluster: String,
    secret: String,
    key_file: PathBuf,
    resend_after_ms: Option<u64>,
    limit_ms: Option<u64>,
    members: Vec<ClientFileMember>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientFileMember {
    id: u64,
    address: String,
    public_key: OneOrMany,
}

/// Reads a client's configuration file (a relative `key_file` is relative to the file's
/// directory). Errors name the key.
pub fn load_client(path: &Path) -> Result<ClientConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let file: ClientFile = toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: e.to_string().trim_end().to_string(),
    })?;
    if file.cluster.trim().is_empty() {
        return Err(invalid("cluster", "must not be empty"));
    }
    if file.secret.len() < MIN_SECRET_BYTES {
        return Err(invalid(
            "secret",
            format!("must be at least {MIN_SECRET_BYTES} bytes"),
        ));
    }
    let key_path = match path.parent() {
        Some(dir) if file.key_file.is_relative() => dir.join(&file.key_file),
        _ => file.key_file.clone(),
    };
    let key = read_key_file("key_file", &key_path)?;
    if file.members.is_empty() {
        return Err(invalid("members", "lists no member to connect to"));
    }
    let mut members = Vec::new();
    let mut member_keys = BTreeMap::new();
    for (i, m) in file.members.into_iter().enumerate() {
        let keys = m.public_key.into_vec();
        let keys = public_keys(&format!("members[{i}].public_key"), &keys)?;
        if keys.is_empty() {
            return Err(invalid(&format!("members[{i}].public_key"), "lists no key"));
        }
        if member_keys.insert(m.id, keys).is_some() {
            return Err(invalid(
                "members",
                format!("member {} is listed twice", m.id),
            ));
        }
        members.push((m.id, address(&format!("members[{i}].address"), &m.address)?));
    }
    let mut cfg = ClientConfig::new(file.cluster, file.secret.into_bytes(), key, Vec::new());
    cfg.members = members;
    cfg.member_keys = member_keys;
    let millis = |key: &str, value: Option<u64>, default: Duration| match value {
        None => Ok(default),
        Some(n) if (1..=3_600_000).contains(&n) => Ok(Duration::from_millis(n)),
        Some(n) => Err(invalid(
            key,
            format!("{n} is not a number of milliseconds from 1 to 3600000"),
        )),
    };
    cfg.resend_after = millis("resend_after_ms", file.resend_after_ms, cfg.resend_after)?;
    cfg.limit = millis("limit_ms", file.limit_ms, cfg.limit)?;
    Ok(cfg)
}
