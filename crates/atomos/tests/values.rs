//! `atomos::Value`, the value any language can store: written on one replica of a `certify`
//! cluster, it reaches the others encoded, as a program in another language would have written
//! it, and reads back whole; a map reads as a Rust struct whose field names match.

use std::collections::BTreeMap;

use atomos::{Cluster, Protocol, TRef, TxError, Value};
use serde::{Deserialize, Serialize};

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Account {
    owner: String,
    balance: i64,
    #[serde(default)]
    frozen: bool,
}

#[test]
fn a_value_written_on_one_replica_reads_on_another_and_as_a_struct() {
    let cluster = Cluster::in_process(3, Protocol::Certify).unwrap();
    let ids = cluster.ids();
    let (writer, reader) = (cluster.node(ids[0]).unwrap(), cluster.node(ids[2]).unwrap());
    let key: TRef<Value> = TRef::new("accounts/ada");
    let mut fields = BTreeMap::new();
    fields.insert("owner".to_string(), Value::from("ada"));
    fields.insert("balance".to_string(), Value::from(40i64));
    fields.insert("tags".to_string(), Value::List(vec!["vip".into()]));
    let written = Value::Map(fields);
    writer
        .atomically(|tx| tx.create(&key, written.clone()))
        .unwrap();

    // The other replica applies the commit from its encoded form.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let read = loop {
        match reader.atomically_read(|tx| tx.read(&key).cloned()) {
            Ok(v) => break v,
            Err(TxError::NotFound { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            Err(e) => panic!("{e:?}"),
        }
    };
    assert_eq!(read, written);
    let account: Account = read.to().unwrap();
    assert_eq!(
        account,
        Account {
            owner: "ada".into(),
            balance: 40,
            frozen: false
        }
    );

    // Updated in place as a value, from the other replica.
    reader
        .atomically(|tx| {
            tx.modify(&key, |v| {
                if let Value::Map(m) = v {
                    m.insert("balance".into(), Value::from(41i64));
                }
            })
        })
        .unwrap();
    // The writer sees it once it has applied that commit (reads are from its own snapshot).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let balance = writer
            .atomically_read(|tx| Ok(tx.read(&key)?.get("balance").cloned()))
            .unwrap();
        if balance == Some(Value::Int(41)) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "balance {balance:?}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
