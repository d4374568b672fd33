//! Procedures through the public API: registered by name with typed arguments and results,
//! invoked under every protocol that runs transactions on the caller's node (`local`, `tfa`,
//! `certify`), with clear errors for unknown names, wrong types and names taken twice, and
//! the bank's money conserved when transfers are invoked from many threads and nodes.

use std::thread;

use atomos::{Cluster, Node, Protocol, RegisterError, TRef, Tx, TxError};
use serde::{Deserialize, Serialize};

const ACCOUNTS: u64 = 16;
const START: i64 = 1_000;

#[derive(Serialize, Deserialize)]
struct Transfer {
    from: u64,
    to: u64,
    amount: i64,
}

/// What a transfer reports: the payer's balance after it.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Receipt {
    payer_balance: i64,
}

fn account(i: u64) -> TRef<i64> {
    TRef::new(format!("account/{i}"))
}

fn transfer(tx: &mut Tx<'_>, t: &Transfer) -> Result<Receipt, TxError> {
    let balance = *tx.read(&account(t.from))?;
    if balance < t.amount {
        return Err(TxError::abort("insufficient funds"));
    }
    tx.write(&account(t.from), balance - t.amount)?;
    tx.modify(&account(t.to), |b| *b += t.amount)?;
    Ok(Receipt {
        payer_balance: balance - t.amount,
    })
}

fn total(tx: &mut Tx<'_>, accounts: &u64) -> Result<i64, TxError> {
    let mut sum = 0;
    for i in 0..*accounts {
        sum += *tx.read(&account(i))?;
    }
    Ok(sum)
}

fn open_accounts(tx: &mut Tx<'_>, accounts: &u64) -> Result<(), TxError> {
    for i in 0..*accounts {
        tx.create(&account(i), START)?;
    }
    Ok(())
}

fn register_bank(node: &Node) {
    node.register("open", open_accounts).unwrap();
    node.register("transfer", transfer).unwrap();
    node.register_read_only("total", total).unwrap();
}

/// Invokes `per_thread` transfers from each of `threads` threads on each node, then checks
/// that every node sees the money conserved.
fn transfers_conserve_money(nodes: &[Node], threads: u64, per_thread: u64) {
    thread::scope(|s| {
        for (n, node) in nodes.iter().enumerate() {
            for t in 0..threads {
                s.spawn(move || {
                    let seed = (n as u64) * 1_000 + t;
                    for k in 0..per_thread {
                        let from = (seed * 7 + k * 3) % ACCOUNTS;
                        let to = (from + 1 + (k + seed) % (ACCOUNTS - 1)) % ACCOUNTS;
                        let args = Transfer {
                            from,
                            to,
                            amount: 1 + (k % 5) as i64,
                        };
                        match node.invoke::<Transfer, Receipt>("transfer", &args) {
                            Ok(r) => assert!(r.payer_balance >= 0),
                            Err(TxError::User(_)) => {} // insufficient funds: nothing written
                            Err(e) => panic!("transfer failed: {e}"),
                        }
                    }
                });
            }
        }
    });
    for node in nodes {
        node.sync().unwrap();
        let sum: i64 = node.invoke("total", &ACCOUNTS).unwrap();
        assert_eq!(sum, START * ACCOUNTS as i64);
    }
}

#[test]
fn a_procedure_runs_with_typed_arguments_and_result() {
    let node = Node::local();
    register_bank(&node);
    node.invoke::<u64, ()>("open", &ACCOUNTS).unwrap();
    let receipt: Receipt = node
        .invoke(
            "transfer",
            &Transfer {
                from: 0,
                to: 1,
                amount: 300,
            },
        )
        .unwrap();
    assert_eq!(receipt, Receipt { payer_balance: 700 });
    assert_eq!(
        node.atomically_read(|tx| Ok(*tx.read(&account(1))?))
            .unwrap(),
        1_300
    );
    // An abort inside the body is the invocation's error, and nothing of it is written.
    let broke = node.invoke::<Transfer, Receipt>(
        "transfer",
        &Transfer {
            from: 0,
            to: 1,
            amount: 10_000,
        },
    );
    assert!(matches!(broke, Err(TxError::User(_))), "{broke:?}");
    let sum: i64 = node.invoke("total", &ACCOUNTS).unwrap();
    assert_eq!(sum, START * ACCOUNTS as i64);
    assert_eq!(
        node.procedures().names(),
        vec!["open".to_string(), "total".into(), "transfer".into()]
    );
}

#[test]
fn bad_invocations_are_typed_errors_and_change_nothing() {
    let node = Node::local();
    register_bank(&node);
    node.invoke::<u64, ()>("open", &ACCOUNTS).unwrap();
    assert!(matches!(
        node.invoke::<u64, i64>("no such thing", &1),
        Err(TxError::NoSuchProcedure { name }) if name == "no such thing"
    ));
    // Wrong argument type, wrong result type: refused before anything runs.
    let wrong_args = node.invoke::<(u64, u64, i64), Receipt>("transfer", &(0, 1, 5));
    assert!(
        matches!(&wrong_args, Err(TxError::ProcedureTypes { name, .. }) if name == "transfer"),
        "{wrong_args:?}"
    );
    let wrong_result = node.invoke::<Transfer, u64>(
        "transfer",
        &Transfer {
            from: 0,
            to: 1,
            amount: 5,
        },
    );
    assert!(matches!(wrong_result, Err(TxError::ProcedureTypes { .. })));
    assert_eq!(
        node.atomically_read(|tx| Ok(*tx.read(&account(0))?))
            .unwrap(),
        START
    );
    // Bytes that do not decode as the arguments (as a remote caller could send).
    let procedure = node.procedures().get("transfer").unwrap();
    let garbage = node.atomically(|tx| procedure.call(tx, &[0xff, 0xff, 0xff]));
    assert!(matches!(garbage, Err(TxError::ProcedureTypes { .. })));
    // A name is registered once; the first body stays.
    assert_eq!(
        node.register("transfer", |_tx: &mut Tx<'_>, _: &u64| Ok(0u64)),
        Err(RegisterError::Taken("transfer".into()))
    );
    // A read-only procedure cannot write.
    node.register_read_only("sneaky", |tx: &mut Tx<'_>, i: &u64| {
        tx.write(&account(*i), 0)
    })
    .unwrap();
    assert!(matches!(
        node.invoke::<u64, ()>("sneaky", &0),
        Err(TxError::WriteInReadOnly { .. })
    ));
    let sum: i64 = node.invoke("total", &ACCOUNTS).unwrap();
    assert_eq!(sum, START * ACCOUNTS as i64);
}

#[test]
fn concurrent_invocations_on_a_local_node_conserve_money() {
    let node = Node::local();
    register_bank(&node);
    node.invoke::<u64, ()>("open", &ACCOUNTS).unwrap();
    transfers_conserve_money(&[node], 4, 2_000);
}

#[test]
fn the_same_procedures_run_under_certify_tfa_and_active() {
    for protocol in [Protocol::Certify, Protocol::Tfa, Protocol::Active] {
        let c = Cluster::in_process(3, protocol).expect("cluster starts");
        let nodes: Vec<Node> = c
            .ids()
            .iter()
            .map(|&id| c.node(id).unwrap().clone())
            .collect();
        for node in &nodes {
            register_bank(node);
        }
        nodes[0].invoke::<u64, ()>("open", &ACCOUNTS).unwrap();
        for node in &nodes {
            node.sync().unwrap();
        }
        transfers_conserve_money(&nodes, 2, 150);
    }
}

/// Under `active` an update procedure is ordered and run on every replica; its own error comes
/// back as the invocation's, with nothing written; closures mix with procedures.
#[test]
fn under_active_procedures_run_on_every_replica_and_mix_with_closures() {
    let c = Cluster::in_process(3, Protocol::Active).expect("cluster starts");
    let nodes: Vec<Node> = c
        .ids()
        .iter()
        .map(|&id| c.node(id).unwrap().clone())
        .collect();
    for node in &nodes {
        register_bank(node);
    }
    nodes[1].invoke::<u64, ()>("open", &ACCOUNTS).unwrap();
    // The caller's replica applied it before answering: its own reads see it at once.
    let seen = nodes[1]
        .atomically_read(|tx| Ok(*tx.read(&account(3))?))
        .unwrap();
    assert_eq!(seen, START);
    let receipt: Receipt = nodes[2]
        .invoke(
            "transfer",
            &Transfer {
                from: 3,
                to: 4,
                amount: 400,
            },
        )
        .unwrap();
    assert_eq!(receipt.payer_balance, 600);
    // A closure on another replica, certified between the procedures.
    nodes[0].sync().unwrap();
    nodes[0]
        .atomically(|tx| tx.modify(&account(4), |b| *b -= 100))
        .unwrap();
    nodes[0]
        .atomically(|tx| tx.modify(&account(5), |b| *b += 100))
        .unwrap();
    let broke = nodes[0].invoke::<Transfer, Receipt>(
        "transfer",
        &Transfer {
            from: 3,
            to: 4,
            amount: 10_000,
        },
    );
    match broke {
        Err(TxError::User(e)) => assert!(e.to_string().contains("insufficient funds"), "{e}"),
        other => panic!("expected the procedure's own error, got {other:?}"),
    }
    for node in &nodes {
        node.sync().unwrap();
        let balances: Vec<i64> = (3..6)
            .map(|i| {
                node.atomically_read(|tx| Ok(*tx.read(&account(i))?))
                    .unwrap()
            })
            .collect();
        assert_eq!(balances, vec![600, 1_300, 1_100]);
        let sum: i64 = node.invoke("total", &ACCOUNTS).unwrap();
        assert_eq!(sum, START * ACCOUNTS as i64);
    }
}
