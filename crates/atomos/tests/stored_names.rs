//! Data outlives the build: values a node wrote under one Rust type are read after a restart by
//! a program whose type of the same declared name lives elsewhere and gained a field.
//!
//! One Rust program cannot hold two types of one stored name, so the reading half runs in a
//! child process: this test binary started again, told by an environment variable which half to
//! run.

mod one_node;

use std::path::{Path, PathBuf};
use std::process::Command;

use atomos::config::NodeSettings;
use atomos::{TRef, TxError};

/// Set in the child: the data directory and address to read from.
const READ_DIR: &str = "ATOMOS_TEST_STORED_NAMES_DIR";
const READ_ADDR: &str = "ATOMOS_TEST_STORED_NAMES_ADDR";

/// The type as the first build had it.
mod inventory_v1 {
    use serde::{Deserialize, Serialize};

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize, atomos::Object)]
    #[atomos(name = "inventory.Item")]
    pub struct Item {
        pub sku: String,
        pub count: u32,
    }
}

/// The same stored type after a refactor: another module, another Rust name, the fields in
/// another order, and a field added with a default.
mod catalog {
    pub mod model {
        use serde::{Deserialize, Serialize};

        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize, atomos::Object)]
        #[atomos(name = "inventory.Item")]
        pub struct Article {
            pub count: u32,
            pub sku: String,
            #[serde(default)]
            pub reserved: u32,
        }
    }
}

fn settings(addr: std::net::SocketAddr, dir: &Path) -> NodeSettings {
    one_node::settings("stored-names", "certify", addr, dir, &[])
}

fn item(i: u32) -> TRef<inventory_v1::Item> {
    TRef::new(format!("item/{i}"))
}

fn article(i: u32) -> TRef<catalog::model::Article> {
    TRef::new(format!("item/{i}"))
}

/// The child's half: reopen the data directory and read every item as an `Article`.
fn read_back(dir: PathBuf, addr: std::net::SocketAddr) {
    let rt = one_node::runtime();
    let node = one_node::start(&rt, &settings(addr, &dir));
    one_node::until_ready(&node, "ready");
    let articles = node
        .node()
        .atomically_read(|tx| {
            (0..20)
                .map(|i| tx.read(&article(i)).cloned())
                .collect::<Result<Vec<_>, TxError>>()
        })
        .unwrap();
    for (i, a) in articles.iter().enumerate() {
        assert_eq!(
            a,
            &catalog::model::Article {
                count: i as u32 * 3,
                sku: format!("sku-{i}"),
                reserved: 0,
            }
        );
    }
    // And the new build writes the new shape over the old.
    node.node()
        .atomically(|tx| tx.modify(&article(0), |a| a.reserved = 2))
        .unwrap();
    let a = node
        .node()
        .atomically_read(|tx| tx.read(&article(0)).cloned());
    assert_eq!(a.unwrap().reserved, 2);
    node.shutdown();
}

#[test]
fn values_written_under_one_rust_path_are_read_under_another() {
    if let (Ok(dir), Ok(addr)) = (std::env::var(READ_DIR), std::env::var(READ_ADDR)) {
        return read_back(PathBuf::from(dir), addr.parse().unwrap());
    }
    let dir = std::env::temp_dir().join(format!("atomos-stored-names-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let rt = one_node::runtime();
    let node = one_node::start(&rt, &settings(one_node::free_address(), &dir));
    one_node::until_ready(&node, "ready");
    for i in 0..20 {
        node.node()
            .atomically(|tx| {
                tx.create(
                    &item(i),
                    inventory_v1::Item {
                        sku: format!("sku-{i}"),
                        count: i * 3,
                    },
                )
            })
            .unwrap();
    }
    node.shutdown();
    drop(node);
    drop(rt);

    let addr = one_node::free_address();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "values_written_under_one_rust_path_are_read_under_another",
            "--nocapture",
        ])
        .env(READ_DIR, &dir)
        .env(READ_ADDR, addr.to_string())
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "the reading build failed (or ran no test):\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// In one program, the second type to use a declared name fails with a clear error and
/// changes nothing.
#[test]
fn a_name_declared_twice_in_one_program_is_refused() {
    if std::env::var(READ_DIR).is_ok() {
        return;
    }
    let encoded = atomos_core_encode_probe();
    match encoded {
        Err(TxError::NameClash {
            name,
            first,
            second,
        }) => {
            assert_eq!(name, "inventory.Item");
            assert!(first.contains("inventory_v1") || second.contains("inventory_v1"));
            assert!(first.contains("Article") || second.contains("Article"));
        }
        other => panic!("{other:?}"),
    }
}

/// Encodes one value of each type through a certify node's commit path: the second fails,
/// and writes nothing.
fn atomos_core_encode_probe() -> Result<(), TxError> {
    let cluster = atomos::Cluster::in_process(1, atomos::Protocol::Certify).unwrap();
    let node = cluster.node(cluster.ids()[0]).unwrap();
    node.atomically(|tx| {
        tx.create(
            &item(1),
            inventory_v1::Item {
                sku: "a".into(),
                count: 1,
            },
        )
    })?;
    let clash = node.atomically(|tx| {
        tx.create(
            &article(2),
            catalog::model::Article {
                count: 1,
                sku: "b".into(),
                reserved: 0,
            },
        )
    });
    // Nothing was written: the object does not exist.
    let untyped: TRef<u64> = TRef::new("item/2");
    assert!(!node.atomically_read(|tx| tx.exists(&untyped)).unwrap());
    clash
}
