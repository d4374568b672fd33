//! A cluster of one member stops and starts again on its data, and commits: its log alone is
//! the majority that recovers it. (`oss` once waited forever here: a suspected epoch's next
//! start was ordered only on another member's report.) Under `tfa`, which keeps one copy in
//! memory, the restarted member reports what it held lost and commits new objects.

mod one_node;

use atomos::TRef;

/// Starts a one-member cluster under `protocol`, creates `value` = 5, stops it and starts it
/// again on its data.
fn restarted(protocol: &str) -> (tokio::runtime::Runtime, atomos::NodeRuntime, TRef<u64>) {
    let dir = std::env::temp_dir().join(format!(
        "atomos-one-member-{protocol}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let s = one_node::settings("one-member", protocol, one_node::free_address(), &dir, &[]);
    let value: TRef<u64> = TRef::new("value");
    {
        let rt = one_node::runtime();
        let node = one_node::start(&rt, &s);
        one_node::until_ready(&node, "ready");
        node.node().atomically(|tx| tx.create(&value, 5)).unwrap();
        node.shutdown();
    }
    let rt = one_node::runtime();
    let node = one_node::start(&rt, &s);
    one_node::until_ready(&node, "ready again");
    (rt, node, value)
}

fn restart_and_commit(protocol: &str) {
    let (_rt, node, value) = restarted(protocol);
    node.node()
        .atomically(|tx| tx.modify(&value, |v| *v += 1))
        .unwrap();
    let v = node.node().atomically_read(|tx| Ok(*tx.read(&value)?));
    assert_eq!(v.unwrap(), 6, "{protocol}");
    node.shutdown();
}

#[test]
fn oss_restarts_and_commits() {
    restart_and_commit("oss");
}

#[test]
fn certify_restarts_and_commits() {
    restart_and_commit("certify");
}

#[test]
fn tfa_restarts_reporting_its_objects_lost() {
    let (_rt, node, value) = restarted("tfa");
    match node.node().atomically(|tx| tx.modify(&value, |v| *v += 1)) {
        Err(atomos::TxError::Lost { node: 1, .. }) => {}
        other => panic!("{other:?}"),
    }
    node.shutdown();
}
