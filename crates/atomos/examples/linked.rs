//! Linked transactions (`node.linked(queue)`): under a replicated protocol a thread's next
//! transaction runs while the commit of its previous one is still on the network, seeing its
//! writes, so commit latency hides behind useful work. Each `run` returns a handle to the
//! value as committed; a commit that conflicted re-runs (with the transactions built on it).
//!
//! On three `oss` nodes in this process: one chain of increments, then chains on every node
//! incrementing one shared counter, with no update lost or counted twice; then the first part
//! again under `certify`. (Links in memory have little latency to hide; over a network each
//! plain transaction would wait a round trip for its commit.)
//!
//! `cargo run -p atomos --example linked`

use std::thread;
use std::time::Instant;

use atomos::{Cluster, Node, Protocol, TRef, TxError};

const N: u64 = 30;

fn counter(name: &str) -> TRef<u64> {
    TRef::new(name)
}

/// `n` increments of counter `name` as one chain on `node` (at most one commit outstanding);
/// returns the values they committed with, and how many were still committing when `run`
/// returned.
fn chain_of_increments(
    node: &Node,
    name: &'static str,
    n: u64,
) -> Result<(Vec<u64>, usize), TxError> {
    let mut chain = node.linked(1);
    let mut handles = Vec::new();
    let mut pending = 0;
    for _ in 0..n {
        let h = chain.run(move |tx| {
            tx.modify(&counter(name), |v| {
                *v += 1;
                *v
            })
        })?;
        pending += usize::from(!h.is_ready());
        handles.push(h);
    }
    // Waits for the outstanding commits (re-running any that conflicted) before the handles.
    chain.finish()?;
    let values = handles
        .into_iter()
        .map(|h| h.wait())
        .collect::<Result<_, _>>()?;
    Ok((values, pending))
}

/// Reads counter `name` on every node once it is up to date.
fn everywhere(c: &Cluster, name: &str) -> Result<Vec<u64>, TxError> {
    let mut values = Vec::new();
    for node in c.ids().into_iter().filter_map(|id| c.node(id)) {
        node.sync()?;
        values.push(node.atomically_read(|tx| Ok(*tx.read(&counter(name))?))?);
    }
    Ok(values)
}

/// One chain on node 2: each transaction runs while the earlier ones are still committing.
fn one_chain(protocol: Protocol) -> Result<(), Box<dyn std::error::Error>> {
    let c = Cluster::in_process(3, protocol)?;
    let node = c.node(2).ok_or("no node 2")?.clone();
    node.atomically(|tx| tx.create(&counter("linked"), 0))?;

    let start = Instant::now();
    let (values, pending) = chain_of_increments(&node, "linked", N)?;
    println!(
        "{protocol}: {N} linked increments in {:?}; {pending} of them were still committing \
         when `run` returned",
        start.elapsed()
    );
    // Each transaction saw the increments still being committed before it, and every node
    // holds the result.
    assert_eq!(values, (1..=N).collect::<Vec<_>>());
    assert_eq!(everywhere(&c, "linked")?, vec![N; 3]);
    Ok(())
}

/// Chains on every node increment one counter: their commits conflict, and the losers re-run.
fn competing_chains() -> Result<(), Box<dyn std::error::Error>> {
    let c = Cluster::in_process(3, Protocol::Oss)?;
    let first = c.node(1).ok_or("no node 1")?;
    first.atomically(|tx| tx.create(&counter("shared"), 0))?;
    let chains: Vec<_> = c
        .ids()
        .into_iter()
        .filter_map(|id| c.node(id).cloned())
        .map(|node| {
            node.sync()?; // Sees the counter before its chain starts.
            Ok(thread::spawn(move || {
                chain_of_increments(&node, "shared", N)
            }))
        })
        .collect::<Result<_, TxError>>()?;
    let mut all = Vec::new();
    for (i, chain) in chains.into_iter().enumerate() {
        let (values, _) = chain.join().expect("a chain panicked")?;
        println!(
            "oss: node {}'s chain committed {:?} ... {:?}",
            i + 1,
            values[0],
            values[values.len() - 1]
        );
        assert!(
            values.windows(2).all(|w| w[0] < w[1]),
            "a chain's values went back"
        );
        all.extend(values);
    }
    all.sort_unstable();
    assert_eq!(
        all,
        (1..=3 * N).collect::<Vec<_>>(),
        "every increment committed once"
    );
    assert_eq!(everywhere(&c, "shared")?, vec![3 * N; 3]);
    println!(
        "oss: 3 chains x {N} increments, every value from 1 to {} committed once",
        3 * N
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    one_chain(Protocol::Oss)?;
    competing_chains()?;
    one_chain(Protocol::Certify)?;
    Ok(())
}
