//! Transactions as fibers on a TFA cluster's runtime, through the public API: many more
//! concurrent transactions than runtime threads, interleaved where they wait for remote
//! answers, with the same results as threads. (An unreachable owner fails a fiber's
//! transaction in time: `tfa.rs`.)

use std::sync::Arc;

use atomos::{Cluster, Fiber, Protocol, TRef, TxError};

const ACCOUNTS: u64 = 16;
const START: i64 = 100;

fn account(i: u64) -> TRef<i64> {
    TRef::new(format!("fiber/acct/{i}"))
}

#[test]
fn fibers_on_every_node_transfer_concurrently_and_conserve_money() {
    let c = Arc::new(Cluster::in_process(3, Protocol::Tfa).expect("cluster starts"));
    let first = c.node(1).unwrap().clone();
    first
        .atomically(|tx| {
            for i in 0..ACCOUNTS {
                tx.create(&account(i), START)?;
            }
            Ok(())
        })
        .unwrap();
    // Eight fibers per node on the cluster's runtime (which has fewer threads than that).
    let per_fiber = 50u64;
    let fibers: Vec<_> = c
        .ids()
        .into_iter()
        .flat_map(|id| (0..8u64).map(move |f| (id, f)))
        .map(|(id, f)| {
            let node = c.node(id).unwrap().clone();
            // SAFETY: the loop holds nothing tied to a thread across its transactions.
            unsafe {
                Fiber::new(move || -> Result<u64, TxError> {
                    let mut seed = id * 1000 + f;
                    for _ in 0..per_fiber {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                        let from = account(seed % ACCOUNTS);
                        let to = account((seed / ACCOUNTS) % ACCOUNTS);
                        node.atomically(|tx| {
                            tx.modify(&from, |v| *v -= 1)?;
                            tx.modify(&to, |v| *v += 1)
                        })?;
                        atomos::fiber::consume_budget();
                    }
                    Ok(per_fiber)
                })
            }
            .expect("a stack for the fiber")
        })
        .collect();
    let done: u64 = c.block_on(async {
        let tasks: Vec<_> = fibers.into_iter().map(tokio::spawn).collect();
        let mut done = 0;
        for t in tasks {
            done += t.await.expect("no panic").expect("every transfer commits");
        }
        done
    });
    assert_eq!(done, 3 * 8 * per_fiber);
    let total = c
        .node(2)
        .unwrap()
        .atomically_read(|tx| {
            let mut sum = 0;
            for i in 0..ACCOUNTS {
                sum += *tx.read(&account(i))?;
            }
            Ok(sum)
        })
        .unwrap();
    assert_eq!(total, START * ACCOUNTS as i64);
}
