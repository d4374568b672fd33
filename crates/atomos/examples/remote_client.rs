//! A remote client invokes a cluster's procedures over TCP. Three `active` members start in
//! this process on loopback ports, each with a key pair of its own, the cluster secret, and
//! the client's public key among the clients it admits; the members register the same
//! procedures before they start. An `atomos::Client` (outside the cluster: it holds only the
//! secret, its own key and the members' addresses and public keys) opens accounts, moves
//! money, gets a procedure's own error back typed, and reads balances. Every member ends with
//! the same balances. (A real deployment gets the same from `atomos cluster up`, which writes
//! the members' configuration files and the client's `client.toml`.)
//!
//! `cargo run -p atomos --example remote_client`

use std::net::{SocketAddr, TcpListener};

use atomos::config::{load, write_key_file};
use atomos::net::keys::KeyPair;
use atomos::{Client, ClientConfig, ClientError, NodeRuntime, ProcedureKind, Procedures};
use atomos::{TRef, TxError};
use serde::{Deserialize, Serialize};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const CLUSTER: &str = "bank-example";
const SECRET: &str = "an example cluster secret, at least 32 bytes long";

#[derive(Serialize, Deserialize)]
struct Transfer {
    from: String,
    to: String,
    amount: i64,
}

fn account(name: &str) -> TRef<i64> {
    TRef::new(format!("account/{name}"))
}

/// The procedures every member registers (deterministic bodies: `active` runs an update on
/// every replica).
fn procedures() -> Result<Procedures, BoxError> {
    let p = Procedures::new();
    p.register(
        "open",
        ProcedureKind::Update,
        |tx, (name, amount): &(String, i64)| tx.create(&account(name), *amount),
    )?;
    p.register("transfer", ProcedureKind::Update, |tx, t: &Transfer| {
        if *tx.read(&account(&t.from))? < t.amount {
            return Err(TxError::abort(format!(
                "{} cannot pay {}",
                t.from, t.amount
            )));
        }
        tx.modify(&account(&t.from), |v| *v -= t.amount)?;
        tx.modify(&account(&t.to), |v| *v += t.amount)
    })?;
    p.register("balance", ProcedureKind::ReadOnly, |tx, name: &String| {
        tx.read(&account(name)).copied()
    })?;
    Ok(p)
}

/// Starts member `id` of the members at `addrs` (with public keys `keys`), over TCP.
async fn start_member(
    id: usize,
    addrs: &[SocketAddr],
    keys: &[KeyPair],
    client: &KeyPair,
    dir: &std::path::Path,
) -> Result<NodeRuntime, BoxError> {
    let peers: Vec<String> = (0..addrs.len())
        .map(|i| format!("{}={}/{}", i + 1, addrs[i], keys[i].public()))
        .collect();
    let key_file = dir.join(format!("node-{id}.key"));
    write_key_file(&key_file, &keys[id - 1], "an example member", true)?;
    // Settings as a node's environment would give them (a TOML file works as well).
    let vars = [
        ("ATOMOS_CLUSTER", CLUSTER.to_string()),
        ("ATOMOS_NODE_ID", id.to_string()),
        ("ATOMOS_LISTEN", addrs[id - 1].to_string()),
        ("ATOMOS_PEERS", peers.join(",")),
        ("ATOMOS_SECRET", SECRET.to_string()),
        ("ATOMOS_KEY_FILE", key_file.display().to_string()),
        ("ATOMOS_CLIENTS", format!("example={}", client.public())),
        ("ATOMOS_PROTOCOL", "active".to_string()),
        (
            "ATOMOS_DATA_DIR",
            dir.join(format!("node-{id}")).display().to_string(),
        ),
        ("ATOMOS_ORDER_FSYNC", "never".to_string()),
    ];
    let settings = load(None, |k| {
        vars.iter()
            .find(|(key, _)| *key == k)
            .map(|(_, v)| v.clone())
    })?;
    Ok(NodeRuntime::start_tcp_with(&settings, procedures()?).await?)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let dir = std::env::temp_dir().join(format!("atomos-remote-client-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // Three free loopback ports, and a key pair per member and for the client.
    let listeners = (0..3)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()?;
    let addrs = listeners
        .iter()
        .map(TcpListener::local_addr)
        .collect::<Result<Vec<_>, _>>()?;
    drop(listeners);
    let keys = (0..3)
        .map(|_| KeyPair::generate())
        .collect::<Result<Vec<_>, _>>()?;
    let client_key = KeyPair::generate()?;
    let mut members = Vec::new();
    for id in 1..=3 {
        members.push(start_member(id, &addrs, &keys, &client_key, &dir).await?);
    }

    // The client: the cluster's name and secret, its own key, each member's address and key.
    let list = (0..3)
        .map(|i| (i as u64 + 1, addrs[i], keys[i].public()))
        .collect();
    let client = Client::connect(ClientConfig::new(CLUSTER, SECRET, client_key, list)).await?;
    println!(
        "connected (protocol {}) through member {}",
        client.protocol(),
        client.reference()
    );

    for (name, amount) in [("alice", 100i64), ("bob", 0)] {
        client
            .invoke::<_, ()>("open", &(name.to_string(), amount))
            .await?;
    }
    for amount in [30, 20, 10] {
        let t = Transfer {
            from: "alice".into(),
            to: "bob".into(),
            amount,
        };
        client.invoke::<_, ()>("transfer", &t).await?;
        println!("moved {amount} from alice to bob");
    }
    // The procedure's own error comes back typed; it wrote nothing.
    let t = Transfer {
        from: "bob".into(),
        to: "alice".into(),
        amount: 1_000,
    };
    let refused = client.invoke::<_, ()>("transfer", &t).await;
    println!("bob pays 1000: {refused:?}");
    assert!(
        matches!(&refused, Err(ClientError::Failed { reason, .. }) if reason.contains("cannot pay"))
    );

    let alice: i64 = client.invoke("balance", &"alice".to_string()).await?;
    let bob: i64 = client.invoke("balance", &"bob".to_string()).await?;
    println!("balances through the client: alice {alice}, bob {bob}");
    assert_eq!((alice, bob), (40, 60));
    // Every replica applied the same invocations.
    for m in &members {
        let node = m.node();
        let seen = tokio::task::block_in_place(|| {
            node.sync()?;
            node.atomically_read(|tx| {
                Ok((*tx.read(&account("alice"))?, *tx.read(&account("bob"))?))
            })
        })?;
        println!("member {}: alice {}, bob {}", m.id(), seen.0, seen.1);
        assert_eq!(seen, (40, 60));
    }
    client.close();
    for m in &members {
        m.shutdown();
    }
    drop(members);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
