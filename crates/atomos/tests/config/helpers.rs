//! Keys, key files, environments and configuration files the tests are made of.

use std::collections::HashMap;
use std::path::PathBuf;

use atomos::config::{write_key_file, ConfigError};
use atomos::net::keys::KeyPair;

/// Key pair `n` (derived from `n`: tests only).
pub(crate) fn keys(n: u8) -> KeyPair {
    KeyPair::from_private([n; 32]).unwrap()
}

/// Key pair `n`'s public key, in hex.
pub(crate) fn pk(n: u8) -> String {
    keys(n).public().to_string()
}

/// A key file holding key pair `n`, readable by its owner only; its path.
pub(crate) fn key_file(n: u8) -> String {
    let path = file(&format!("key-{n}.key"), "");
    write_key_file(&path, &keys(n), "a test", true).unwrap();
    path.display().to_string()
}

pub(crate) fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

pub(crate) fn file(name: &str, text: &str) -> PathBuf {
    // A directory per test (each runs on a thread of its own): tests run in parallel and
    // several write a file of the same name (`key-1.key`), which one could read while another
    // rewrites it. One test's files share a directory (a configuration names its key file
    // relative to itself).
    let test = format!("{:?}", std::thread::current().id())
        .chars()
        .filter(char::is_ascii_digit)
        .collect::<String>();
    let dir =
        std::env::temp_dir().join(format!("atomos-config-test-{}/{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

pub(crate) fn key_of(e: ConfigError) -> String {
    match e {
        ConfigError::Invalid { key, .. } => key,
        other => panic!("expected an invalid key, got {other}"),
    }
}

pub(crate) const SECRET: &str = "0123456789abcdef0123456789abcdef";
