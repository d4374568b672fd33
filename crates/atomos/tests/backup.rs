//! Backups of a live cluster and restores into a new one: a backup taken by a remote client
//! while transfers run holds every transfer acknowledged before it was asked for, checks
//! itself, and seeds a new cluster of other members (other ids, other addresses) whose money
//! adds up and which goes on committing.

mod tcp_members;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use atomos::backup::{Backup, BackupError};
use atomos::config::{load, write_key_file, NodeSettings};
use atomos::{Client, ClientConfig, NodeRuntime, Procedures, TRef};
use tcp_members::{client_key, free_addresses, member_key, SECRET};

const CLUSTER: &str = "backup-test";
const ACCOUNTS: u64 = 20;
const WORKERS: u64 = 2;

fn account(i: u64) -> TRef<i64> {
    TRef::new(atomos::Key::with_index("acct/", i))
}

/// How many transfers worker `w` committed, written by each transfer itself.
fn done(w: u64) -> TRef<u64> {
    TRef::new(atomos::Key::with_index("done/", w))
}

/// The settings of member `id` of the cluster of `members` (ids and addresses), its data in
/// `dir/node-ID`.
fn settings(id: u64, members: &[(u64, SocketAddr)], dir: &Path) -> NodeSettings {
    let peers: Vec<String> = members
        .iter()
        .map(|(m, a)| format!("{m}={a}/{}", member_key(*m).public()))
        .collect();
    let listen = members.iter().find(|(m, _)| *m == id).unwrap().1;
    std::fs::create_dir_all(dir).unwrap();
    let key_file = dir.join(format!("node-{id}.key"));
    write_key_file(&key_file, &member_key(id), "a test member", true).unwrap();
    let vars = [
        ("ATOMOS_CLUSTER", CLUSTER.to_string()),
        ("ATOMOS_NODE_ID", id.to_string()),
        ("ATOMOS_LISTEN", listen.to_string()),
        ("ATOMOS_PEERS", peers.join(",")),
        ("ATOMOS_SECRET", SECRET.to_string()),
        ("ATOMOS_KEY_FILE", key_file.display().to_string()),
        ("ATOMOS_CLIENTS", format!("test={}", client_key().public())),
        ("ATOMOS_PROTOCOL", "certify".to_string()),
        ("ATOMOS_DATA_DIR", node_dir(dir, id).display().to_string()),
        ("ATOMOS_ORDER_FSYNC", "never".to_string()),
    ];
    load(None, |k| {
        vars.iter()
            .find(|(key, _)| *key == k)
            .map(|(_, v)| v.clone())
    })
    .unwrap()
}

fn node_dir(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("node-{id}"))
}

fn test_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("atomos-backup-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn start(members: &[(u64, SocketAddr)], dir: &Path) -> Vec<NodeRuntime> {
    let mut nodes = Vec::new();
    for &(id, _) in members {
        let s = settings(id, members, dir);
        nodes.push(
            NodeRuntime::start_tcp_with(&s, Procedures::new())
                .await
                .unwrap(),
        );
    }
    nodes
}

fn client_config(members: &[(u64, SocketAddr)]) -> ClientConfig {
    let members = members
        .iter()
        .map(|&(id, addr)| (id, addr, member_key(id).public()))
        .collect();
    let mut cfg = ClientConfig::new(CLUSTER, SECRET.as_bytes().to_vec(), client_key(), members);
    cfg.resend_after = Duration::from_millis(300);
    cfg.limit = Duration::from_secs(20);
    cfg
}

fn total(node: &atomos::Node) -> i64 {
    node.atomically_read(|tx| (0..ACCOUNTS).map(|i| tx.read(&account(i)).copied()).sum())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_load_restores_into_a_new_cluster_with_every_acknowledged_transfer() {
    let dir = test_dir("live");
    let old_members: Vec<(u64, SocketAddr)> = (1..=3).zip(free_addresses(3)).collect();
    let old = start(&old_members, &dir).await;
    let first = old[0].node().clone();
    tokio::task::spawn_blocking(move || {
        first
            .atomically(|tx| {
                for i in 0..ACCOUNTS {
                    tx.create(&account(i), 1_000)?;
                }
                for w in 0..WORKERS {
                    tx.create(&done(w), 0)?;
                }
                Ok(())
            })
            .unwrap()
    })
    .await
    .unwrap();

    // Transfers from two members, each counting itself in the same transaction.
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..WORKERS).map(|_| AtomicU64::new(0)).collect());
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let node = old[w as usize].node().clone();
        let (stop, acked) = (stop.clone(), acked.clone());
        workers.push(std::thread::spawn(move || {
            let mut x = w + 1;
            while !stop.load(Ordering::Relaxed) {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let (a, b) = ((x >> 33) % ACCOUNTS, (x >> 17) % ACCOUNTS);
                if a == b {
                    continue;
                }
                node.atomically(|tx| {
                    tx.modify(&account(a), |v| *v -= 3)?;
                    tx.modify(&account(b), |v| *v += 3)?;
                    tx.modify(&done(w), |n| *n += 1)
                })
                .unwrap();
                acked[w as usize].fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(800)).await;

    // The backup, asked for while the transfers go on.
    let before: Vec<u64> = acked.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    assert!(before.iter().all(|&n| n > 0), "the load ran: {before:?}");
    let client = Client::connect(client_config(&old_members)).await.unwrap();
    let file = dir.join("cluster.backup");
    let header = client
        .backup(&file, Duration::from_secs(30))
        .await
        .expect("a backup is taken");
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(header.protocol, "certify");
    assert!(header.index > 0);
    let backup = Backup::read(&file).expect("the backup checks");
    assert_eq!(backup.header, header);
    for node in &old {
        node.shutdown();
    }
    drop(old);

    // A new cluster: other ids, other addresses, each data directory seeded from the file.
    let new_dir = test_dir("restored");
    let new_members: Vec<(u64, SocketAddr)> = (11..=13).zip(free_addresses(3)).collect();
    let ids: Vec<u64> = new_members.iter().map(|(id, _)| *id).collect();
    for &id in &ids {
        backup.restore(&node_dir(&new_dir, id), &ids).unwrap();
    }
    // A directory is seeded once.
    assert!(matches!(
        backup.restore(&node_dir(&new_dir, 11), &ids),
        Err(BackupError::Refused(_))
    ));
    let new = start(&new_members, &new_dir).await;
    let node = new[0].node().clone();
    let (sum, counted) = tokio::task::spawn_blocking(move || {
        node.sync().unwrap();
        let counted: Vec<u64> = (0..WORKERS)
            .map(|w| {
                node.atomically_read(|tx| tx.read(&done(w)).copied())
                    .unwrap()
            })
            .collect();
        // It commits on top of what it restored.
        node.atomically(|tx| {
            tx.modify(&account(0), |v| *v -= 5)?;
            tx.modify(&account(1), |v| *v += 5)
        })
        .unwrap();
        (total(&node), counted)
    })
    .await
    .unwrap();
    assert_eq!(sum, 1_000 * ACCOUNTS as i64, "the money adds up");
    for w in 0..WORKERS as usize {
        assert!(
            counted[w] >= before[w],
            "worker {w}: {} transfers acknowledged before the backup, {} in it",
            before[w],
            counted[w]
        );
    }
    for node in &new {
        node.shutdown();
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&new_dir);
}

#[test]
fn a_damaged_or_foreign_file_is_refused_with_what_is_wrong() {
    let dir = test_dir("damaged");
    let not_one = dir.join("notes.txt");
    std::fs::write(&not_one, b"shopping list").unwrap();
    let err = Backup::read(&not_one).unwrap_err().to_string();
    assert!(err.contains("not an atomos backup"), "{err}");
    let missing = Backup::read(&dir.join("missing")).unwrap_err();
    assert!(matches!(missing, BackupError::Io { .. }));
    let _ = std::fs::remove_dir_all(&dir);
}
