//! Key files: a member's or a client's key pair on disk, readable by its owner only.
//!
//! ```toml
//! # atomos key pair of member 1: keep this file readable by its owner only
//! public_key = "64 hex digits"
//! private_key = "64 hex digits"
//! ```
//!
//! A file that its group or others may read (or write) is refused, as SSH refuses such a
//! private key: a key that others could have read proves nothing.

use std::fs::OpenOptions;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use atomos_net::keys::KeyPair;
use serde::Deserialize;
use zeroize::Zeroizing;

use super::{invalid, ConfigError};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFileText {
    public_key: String,
    private_key: String,
}

/// Reads the key pair in `path`, which `key` (the configuration key or variable naming the
/// file) is blamed for: a file others may read, a malformed file, or a public key that is not
/// the private key's is refused.
pub fn read_key_file(key: &str, path: &Path) -> Result<KeyPair, ConfigError> {
    let shown = path.display();
    let cannot_read =
        |e: std::io::Error| invalid(key, format!("cannot read the key file {shown}: {e}"));
    // One open: the mode checked is the mode of the file read.
    let mut file = std::fs::File::open(path).map_err(cannot_read)?;
    let mode = file.metadata().map_err(cannot_read)?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(invalid(
            key,
            format!(
                "the key file {shown} may be read or written by others (mode {mode:03o}): \
                 run `chmod 600 {shown}`"
            ),
        ));
    }
    let mut text = Zeroizing::new(String::new());
    file.read_to_string(&mut text).map_err(cannot_read)?;
    let parsed: KeyFileText = toml::from_str(text.as_str()).map_err(|e| {
        invalid(
            key,
            format!(
                "{shown} is not a key file (`atomos keygen` writes one): {}",
                e.message()
            ),
        )
    })?;
    let private = Zeroizing::new(parsed.private_key);
    KeyPair::from_hex(private.as_str(), Some(&parsed.public_key))
        .map_err(|e| invalid(key, format!("{shown}: {e}")))
}

/// The text of a key file holding `keys`, described as `what` ("member 1", "client app");
/// wiped from memory when dropped.
pub fn key_file_text(keys: &KeyPair, what: &str) -> Zeroizing<String> {
    Zeroizing::new(format!(
        "# atomos key pair of {what}: keep this file readable by its owner only\n\
         public_key = \"{}\"\nprivate_key = \"{}\"\n",
        keys.public(),
        keys.private_hex().as_str()
    ))
}

/// Writes `keys` to a new file at `path`, readable and writable by its owner only. An existing
/// file is replaced only if `replace`.
pub fn write_key_file(
    path: &Path,
    keys: &KeyPair,
    what: &str,
    replace: bool,
) -> std::io::Result<()> {
    let mut options = OpenOptions::new();
    options.write(true).mode(0o600);
    if replace {
        options.create(true).truncate(true);
    } else {
        options.create_new(true);
    }
    let mut file = options.open(path)?;
    // A file that existed keeps its mode through `open`: make it the owner's alone.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(key_file_text(keys, what).as_bytes())?;
    file.sync_all()
}
