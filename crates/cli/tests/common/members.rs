//! Changing a running cluster's members from a test: `atomos member` and `atomos status` as an
//! operator runs them, and a new node that joins with a key of its own and an empty disk.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::{public_key_of, ATOMOS};

/// Runs `atomos ARGS`.
pub fn atomos(args: &[&str]) -> Output {
    Command::new(ATOMOS).args(args).output().unwrap()
}

/// Refusals that say an earlier attempt's change was made (its answer was lost).
const MADE_ALREADY: [&str; 4] = [
    "is a member already",
    "is not a learner",
    "is not a voter",
    "is not a member",
];

/// `atomos member ARGS --client FILE`, retried while the cluster asks to wait (exit 1: a
/// learner still catching up, a change under way, no leader yet), until it succeeds or, after
/// a first attempt, the refusal says the change was made.
pub fn member_until_done(client: &Path, args: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut attempts = 0;
    loop {
        attempts += 1;
        let mut all = vec!["member"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--client", client.to_str().unwrap()]);
        let out = atomos(&all);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() || (attempts > 1 && MADE_ALREADY.iter().any(|m| text.contains(m))) {
            return text;
        }
        assert_eq!(out.status.code(), Some(1), "{args:?}: {text}");
        assert!(
            Instant::now() < deadline,
            "{args:?} never went through: {text}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The members `atomos member list --json` shows: id to role (empty when it fails).
pub fn members(client: &Path) -> BTreeMap<u64, String> {
    let out = atomos(&[
        "member",
        "list",
        "--json",
        "--client",
        client.to_str().unwrap(),
    ]);
    if !out.status.success() {
        return BTreeMap::new();
    }
    let listed: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
    listed
        .iter()
        .filter_map(|m| Some((m["id"].as_u64()?, m["role"].as_str()?.to_string())))
        .collect()
}

/// Waits (up to a minute) until the members and their roles are `want`.
pub fn wait_members(client: &Path, want: &[(u64, &str)]) {
    let want: BTreeMap<u64, String> = want.iter().map(|&(i, r)| (i, r.to_string())).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = members(client);
        if now == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "members never became {want:?}: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The leader `atomos status --json` names once a majority follows one, waiting up to a
/// minute.
pub fn wait_leader(client: &Path) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = atomos(&["status", "--json", "--client", client.to_str().unwrap()]);
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let cluster = &doc["cluster"];
        if cluster["can_commit"].as_bool() == Some(true) {
            if let Some(id) = cluster["leader"][0].as_u64() {
                return id;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no leader a majority follows: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Starts node `id` as a new member would be: a key of its own, an empty data directory, node
/// 1's configuration otherwise (its founders as peers) with `order_join = true`, listening on
/// `base_port + id - 1` (metrics 100 above), logging to `node-ID.log`. Returns it with its
/// address and public key, for `atomos member add`.
pub fn start_joiner(
    dir: &Path,
    base_port: u16,
    id: u64,
    env: &[(&str, &str)],
) -> (Child, String, String) {
    let key = dir.join(format!("node-{id}.key"));
    let made = atomos(&[
        "keygen",
        "--member",
        &id.to_string(),
        "--out",
        key.to_str().unwrap(),
    ]);
    assert!(made.status.success(), "{made:?}");
    let port = base_port + id as u16 - 1;
    let text = std::fs::read_to_string(dir.join("node-1.toml")).unwrap();
    let config = text
        .replace("node_id = 1", &format!("node_id = {id}"))
        .replace(
            &format!("listen = \"127.0.0.1:{base_port}\""),
            &format!("listen = \"127.0.0.1:{port}\""),
        )
        .replace(
            &format!("metrics = \"127.0.0.1:{}\"", base_port + 100),
            &format!("metrics = \"127.0.0.1:{}\"", port + 100),
        )
        .replace("node-1.key", &format!("node-{id}.key"))
        .replace(
            &format!("{}", dir.join("data").join("1").display()),
            &format!("{}", dir.join("data").join(id.to_string()).display()),
        );
    assert!(config.contains(&format!("node_id = {id}")) && config.contains(&port.to_string()));
    let path = dir.join(format!("node-{id}.toml"));
    std::fs::write(&path, format!("order_join = true\n{config}")).unwrap();
    let child = Command::new(ATOMOS)
        .args(["node", "--config"])
        .arg(&path)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("node-{id}.log"))).unwrap())
        .spawn()
        .unwrap();
    (child, format!("127.0.0.1:{port}"), public_key_of(&key))
}

/// Starts member `id` again from its configuration and data in `dir` (after a kill), its log
/// appended to `node-ID.log`.
pub fn restart_member(dir: &Path, id: u64, env: &[(&str, &str)]) -> Child {
    let log = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join(format!("node-{id}.log")))
        .unwrap();
    Command::new(ATOMOS)
        .args(["node", "--config"])
        .arg(dir.join(format!("node-{id}.toml")))
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// `atomos member ARGS`, asked again while the membership does not show it made (`made`: a
/// leader change can drop a proposal the cluster answered).
pub fn change_until(client: &Path, args: &[&str], made: impl Fn(&BTreeMap<u64, String>) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        member_until_done(client, args);
        let listed = Instant::now() + Duration::from_secs(10);
        while Instant::now() < listed {
            if made(&members(client)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        assert!(Instant::now() < deadline, "{args:?} never took effect");
    }
}

/// `atomos member add` for a node [`start_joiner`] started, asked again while the membership
/// does not list it.
pub fn add_learner(client: &Path, id: u64, address: &str, public_key: &str) {
    let id_text = id.to_string();
    let args = [
        "add",
        "--id",
        &id_text,
        "--address",
        address,
        "--public-key",
        public_key,
    ];
    change_until(client, &args, |m| m.contains_key(&id));
}
