//! A bank: several threads move money between accounts at once, under each protocol in turn
//! (`local`, `certify`, `active`, `tfa`, `oss`). The application code is the same every time;
//! only how the nodes are made changes. At the end every node audits the total, which must be
//! what the bank started with.
//!
//! `cargo run -p atomos --example bank`

use std::thread;
use std::time::Instant;

use atomos::{Cluster, Key, Node, Protocol, TRef, TxError};

const ACCOUNTS: u64 = 8;
const INITIAL: i64 = 100;
const THREADS_PER_NODE: u64 = 2;
const TRANSFERS_PER_THREAD: u64 = 40;

fn account(i: u64) -> TRef<i64> {
    TRef::new(Key::with_index("acct/", i))
}

/// Moves `amount` from `from` to `to` if `from` holds enough; returns whether it did.
fn transfer(node: &Node, from: u64, to: u64, amount: i64) -> Result<bool, TxError> {
    node.atomically(|tx| {
        if *tx.read(&account(from))? < amount {
            return Ok(false); // Commits having changed nothing.
        }
        tx.modify(&account(from), |v| *v -= amount)?;
        tx.modify(&account(to), |v| *v += amount)?;
        Ok(true)
    })
}

/// The sum of every balance, read as one consistent snapshot.
fn audit(node: &Node) -> Result<i64, TxError> {
    node.atomically_read(|tx| (0..ACCOUNTS).map(|i| tx.read(&account(i)).copied()).sum())
}

/// Runs the bank on `nodes` (all of one cluster, or one local node); returns the transfers made.
fn run_bank(protocol: Protocol, nodes: &[Node]) -> Result<u64, TxError> {
    // Any node can create the accounts; the others see them (after `sync` where reads are
    // local replicas that may lag).
    nodes[0].atomically(|tx| (0..ACCOUNTS).try_for_each(|i| tx.create(&account(i), INITIAL)))?;
    for node in nodes {
        node.sync()?;
    }
    let workers: Vec<_> = nodes
        .iter()
        .enumerate()
        .flat_map(|(n, node)| (0..THREADS_PER_NODE).map(move |t| (n as u64, t, node.clone())))
        .map(|(n, t, node)| {
            thread::spawn(move || -> Result<u64, TxError> {
                let mut moved = 0;
                for k in 0..TRANSFERS_PER_THREAD {
                    // A fixed pattern of transfers, different on every thread.
                    let seed = n * 31 + t * 17 + k * 7;
                    let (from, to) = (seed % ACCOUNTS, (seed / 3 + 1 + k) % ACCOUNTS);
                    if from != to && transfer(&node, from, to, 1 + (seed % 25) as i64)? {
                        moved += 1;
                    }
                }
                Ok(moved)
            })
        })
        .collect();
    let mut moved = 0;
    for w in workers {
        moved += w.join().expect("a transfer thread panicked")?;
    }
    // Every node must see every account and the same total.
    for (i, node) in nodes.iter().enumerate() {
        node.sync()?;
        let total = audit(node)?;
        println!(
            "  {:>7} node {}: audited total {total}",
            protocol.to_string(),
            i + 1
        );
        assert_eq!(
            total,
            ACCOUNTS as i64 * INITIAL,
            "{protocol}: money was made or lost"
        );
    }
    Ok(moved)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for protocol in [
        Protocol::Local,
        Protocol::Certify,
        Protocol::Active,
        Protocol::Tfa,
        Protocol::Oss,
    ] {
        let start = Instant::now();
        // `local` is one embedded node; the others are three nodes in this process, linked in
        // memory. The cluster must outlive the nodes' use: it stops them when dropped.
        let cluster;
        let nodes: Vec<Node> = if protocol == Protocol::Local {
            vec![Node::local()]
        } else {
            cluster = Cluster::in_process(3, protocol)?;
            cluster
                .ids()
                .into_iter()
                .filter_map(|id| cluster.node(id).cloned())
                .collect()
        };
        let moved = run_bank(protocol, &nodes)?;
        // Each node counts the transactions run on it (the audits included), and the attempts
        // it aborted and re-ran.
        let commits: u64 = nodes.iter().map(|n| n.stats().commits).sum();
        let aborts: u64 = nodes.iter().map(|n| n.stats().aborts.total()).sum();
        println!(
            "{:>7}: {moved} transfers by {} threads on {} node(s): {commits} commits, \
             {aborts} aborted attempts, {:?}",
            protocol.to_string(),
            nodes.len() as u64 * THREADS_PER_NODE,
            nodes.len(),
            start.elapsed()
        );
        assert!(moved > 0, "{protocol}: no transfer went through");
    }
    Ok(())
}
