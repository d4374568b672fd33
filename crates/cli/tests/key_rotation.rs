//! A member's key rotated on real processes while the cluster serves, as docs/design/trust.md
//! tells an operator to: `atomos keygen` makes member 2 a new key; members 1
//! and 3 list both keys and get SIGHUP; member 2 restarts with its new key (1 and 3 answer
//! each other throughout); every member then lists only the new key and gets SIGHUP: the links
//! to member 2 stay up.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

mod common;

use common::{
    cluster_up, public_key_of, restart, signal, wait_exit, wait_for_line, KillOnDrop, ATOMOS,
};

/// Replaces `from` by `to` in node `n`'s configuration file (the text must be there).
fn edit(dir: &Path, n: usize, from: &str, to: &str) {
    let path = dir.join(format!("node-{n}.toml"));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "node {n}'s file lacks {from:?}");
    std::fs::write(&path, text.replace(from, to)).unwrap();
}

/// How many lines `path` holds now.
fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .count()
}

#[test]
fn a_members_key_rotates_while_the_others_keep_serving() {
    let dir = std::env::temp_dir().join(format!("atomos-key-rotation-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let base_port = common::free_base_port(3);
    let (mut up, pids) = cluster_up(3, base_port, &dir, &[]);
    let mut cleanup = KillOnDrop(pids.iter().copied().chain([up.id()]).collect());
    let log = |n: usize| dir.join(format!("node-{n}.log"));
    for (a, b) in [(1, 2), (1, 3), (3, 2)] {
        wait_for_line(&log(a), 0, &["peer answers", &format!("peer={b}")]);
    }

    // 1. A new key for member 2.
    let new_file = dir.join("node-2-new.key");
    let out = Command::new(ATOMOS)
        .args(["keygen", "--member", "2", "--out"])
        .arg(&new_file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let old = public_key_of(&dir.join("node-2.key"));
    let new = public_key_of(&new_file);
    let (old_entry, both) = (
        format!("public_key = \"{old}\""),
        format!("public_key = [\"{old}\", \"{new}\"]"),
    );

    // 2. Members 1 and 3 admit both keys.
    for n in [1, 3] {
        edit(&dir, n, &old_entry, &both);
        signal(pids[n - 1], libc::SIGHUP);
        wait_for_line(
            &log(n),
            0,
            &["SIGHUP: keys reloaded", "members_rekeyed=[2]"],
        );
    }

    // 3. Member 2 restarts with its new key; 1 and 3 keep answering each other.
    let before = lines(&log(1));
    signal(pids[1], libc::SIGTERM);
    wait_for_line(&log(1), before, &["peer does not answer", "peer=2"]);
    let key_line = format!(
        "key_file = {:?}",
        dir.join("node-2.key").display().to_string()
    );
    let new_key_line = format!("key_file = {:?}", new_file.display().to_string());
    edit(&dir, 2, &key_line, &new_key_line);
    edit(&dir, 2, &old_entry, &format!("public_key = \"{new}\""));
    let marks = [lines(&log(1)), lines(&log(3))];
    let (mut two, two_log) = restart(&dir, 1, 1);
    cleanup.0.push(two.id());
    wait_for_line(&log(1), marks[0], &["link up", "peer=2"]);
    wait_for_line(&log(3), marks[1], &["link up", "peer=2"]);
    wait_for_line(&two_log, 0, &["peer answers", "peer=1"]);
    wait_for_line(&two_log, 0, &["peer answers", "peer=3"]);
    let text = std::fs::read_to_string(log(1)).unwrap();
    assert!(
        !text
            .lines()
            .any(|l| l.contains("peer does not answer") && l.contains("peer=3")),
        "members 1 and 3 lost each other during the rotation"
    );

    // 4. The old key is retired everywhere; the links to member 2 stay up.
    let marks = [lines(&log(1)), lines(&log(3))];
    for (i, n) in [1, 3].into_iter().enumerate() {
        edit(&dir, n, &both, &format!("public_key = \"{new}\""));
        signal(pids[n - 1], libc::SIGHUP);
        wait_for_line(
            &log(n),
            marks[i],
            &["SIGHUP: keys reloaded", "members_rekeyed=[2]"],
        );
    }
    std::thread::sleep(Duration::from_secs(2));
    for (i, n) in [1, 3].into_iter().enumerate() {
        let text = std::fs::read_to_string(log(n)).unwrap();
        let closed = text
            .lines()
            .skip(marks[i])
            .any(|l| l.contains("link down") && l.contains("peer=2"));
        assert!(
            !closed,
            "member {n} closed its link to member 2, which holds its new key"
        );
    }

    signal(two.id(), libc::SIGTERM);
    assert!(wait_exit(&mut two, Duration::from_secs(15)).success());
    signal(up.id(), libc::SIGTERM);
    assert!(wait_exit(&mut up, Duration::from_secs(15)).success());
}
