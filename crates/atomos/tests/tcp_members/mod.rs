//! What the tests of clusters of several members over TCP in this process share: the secret,
//! free loopback addresses, and keys derived from ids.

#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener};

use atomos::net::keys::KeyPair;

/// The cluster secret of these tests.
pub const SECRET: &str = "a cluster secret of at least thirty-two bytes";

/// `n` loopback addresses, free when asked (all bound at once, so they differ).
pub fn free_addresses(n: usize) -> Vec<SocketAddr> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners.iter().map(|l| l.local_addr().unwrap()).collect()
}

/// Member `id`'s key pair (derived from its id: tests only).
pub fn member_key(id: u64) -> KeyPair {
    KeyPair::from_private([id as u8; 32]).unwrap()
}

/// The key pair of the clients these tests run (the members admit it as "test").
pub fn client_key() -> KeyPair {
    KeyPair::from_private([0xc1; 32]).unwrap()
}
