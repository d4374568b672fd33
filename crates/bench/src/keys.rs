//! The benchmark members' identities: key pairs derived from their ids, so that every process
//! of a benchmark knows every member's public key without exchanging files. Anyone can derive
//! them: they are for benchmark clusters on one machine, never for data.

use std::sync::Arc;

use atomos::net::handshake::Identity;
use atomos::net::keys::KeyPair;
use atomos::net::roster::Roster;

/// The benchmarks' cluster secret.
const SECRET: &str = "bench secret";

/// Member `id`'s key pair.
pub fn member_key(id: u64) -> KeyPair {
    let mut private = [0u8; 32];
    private[..16].copy_from_slice(b"atomos bench key");
    private[16..24].copy_from_slice(&id.to_be_bytes());
    // Any 32 bytes are an X25519 private key.
    KeyPair::from_private(private).expect("X25519 is available")
}

/// Member `id` of benchmark cluster `cluster`.
pub fn member_identity(cluster: &str, id: u64) -> Result<Identity, String> {
    Identity::member(cluster, id, SECRET, member_key(id)).map_err(|e| e.to_string())
}

/// A roster of the members `ids`, with no clients.
pub fn roster(ids: impl IntoIterator<Item = u64>) -> Arc<Roster> {
    Arc::new(Roster::new(
        ids.into_iter()
            .map(|id| (id, vec![member_key(id).public()])),
        [],
    ))
}
