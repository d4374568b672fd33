//! Several nodes in one process over in-memory links.

use std::time::Duration;

use atomos::{Cluster, PeerState, Protocol, TRef};

#[test]
fn in_process_nodes_answer_each_other_and_run_transactions() {
    let cluster = Cluster::in_process(3, Protocol::Local).unwrap();
    assert_eq!(cluster.ids(), vec![1, 2, 3]);
    for from in 1..=3 {
        for to in (1..=3).filter(|&t| t != from) {
            cluster.ping(from, to, Duration::from_secs(5)).unwrap();
        }
    }
    assert!(cluster.ping(1, 9, Duration::from_millis(100)).is_err());

    let counter: TRef<u64> = TRef::new("hits");
    for id in cluster.ids() {
        let node = cluster.node(id).unwrap();
        node.atomically(|tx| tx.create(&counter, id)).unwrap();
        assert_eq!(
            node.atomically_read(|tx| Ok(*tx.read(&counter)?)).unwrap(),
            id
        );
    }

    // The probes see every peer answer.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let peers = cluster.member(1).unwrap().peers();
        if peers.len() == 2 && peers.values().all(|s| matches!(s, PeerState::Answers(_))) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{peers:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(Cluster::in_process(0, Protocol::Local).is_err());
}
