//! A one-member cluster in this process, over TCP, on a data directory: what the tests of data
//! that outlives a node (stored names, the on-disk fixtures) start and stop.

#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::time::{Duration, Instant};

use atomos::config::{load, write_key_file, NodeSettings};
use atomos::net::keys::KeyPair;
use atomos::{NodeRuntime, TRef};

const SECRET: &str = "a cluster secret of at least thirty-two bytes";

/// A loopback address free when asked.
pub fn free_address() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Member 1 of the one-member cluster `cluster` under `protocol`, listening on `addr`, its
/// data in `dir/node-1` (its key file in `dir`), with `extra` settings as `ATOMOS_` variables.
pub fn settings(
    cluster: &str,
    protocol: &str,
    addr: SocketAddr,
    dir: &Path,
    extra: &[(&str, &str)],
) -> NodeSettings {
    let key = KeyPair::from_private([1; 32]).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let key_file = dir.join("node-1.key");
    write_key_file(&key_file, &key, "a test member", true).unwrap();
    let mut vars = vec![
        ("ATOMOS_CLUSTER".to_string(), cluster.to_string()),
        ("ATOMOS_NODE_ID".into(), "1".into()),
        ("ATOMOS_LISTEN".into(), addr.to_string()),
        ("ATOMOS_PEERS".into(), format!("1={addr}/{}", key.public())),
        ("ATOMOS_SECRET".into(), SECRET.to_string()),
        ("ATOMOS_KEY_FILE".into(), key_file.display().to_string()),
        ("ATOMOS_PROTOCOL".into(), protocol.to_string()),
        (
            "ATOMOS_DATA_DIR".into(),
            dir.join("node-1").display().to_string(),
        ),
        ("ATOMOS_ORDER_FSYNC".into(), "batch".into()),
    ];
    for (k, v) in extra {
        vars.push((k.to_string(), v.to_string()));
    }
    load(None, |k| {
        vars.iter()
            .rev()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    })
    .unwrap()
}

/// A runtime for the node's tasks.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Starts the node (with no procedures).
pub fn start(rt: &tokio::runtime::Runtime, settings: &NodeSettings) -> NodeRuntime {
    rt.block_on(NodeRuntime::start_tcp(settings)).unwrap()
}

/// Waits until the node commits a transaction (its replica has found its cluster and replayed
/// its log), counting in the object `key`.
pub fn until_ready(node: &NodeRuntime, key: &str) {
    let probe: TRef<u64> = TRef::new(key);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let done = node.node().atomically(|tx| {
            if tx.exists(&probe)? {
                tx.modify(&probe, |v| *v += 1)
            } else {
                tx.create(&probe, 1)
            }
        });
        match done {
            Ok(()) => return,
            Err(e) if Instant::now() > deadline => panic!("never ready: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}
