//! `atomos cluster up`: N node processes on loopback with a generated secret, a key pair per
//! member, a client key pair the members admit (`client.key`, with `client.toml` for programs
//! that connect as clients), and configuration.

use std::fmt::Write as _;
use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use atomos::net::keys::KeyPair;
use atomos::protocols::oss::CommitMode;
use atomos::Protocol;
use serde::Serialize;
use tokio::signal::unix::{signal, SignalKind};

/// What `cluster up` was asked for.
pub struct UpArgs {
    pub nodes: usize,
    pub protocol: String,
    pub base_port: u16,
    pub dir: PathBuf,
    /// Run an order-layer replica on every node.
    pub order: bool,
    /// Generated order load: closed-loop clients per node.
    pub order_load: usize,
    /// Generated bank load: transfer threads per node.
    pub bank_load: usize,
    /// Under `oss`: how commits are numbered.
    pub oss_commit: String,
}

struct Member {
    id: usize,
    child: Child,
    listen: String,
    metrics: String,
    exited: bool,
}

/// Prints a line on standard output; a closed output (the reader went away) is not a reason
/// to stop managing the nodes.
macro_rules! say {
    ($($arg:tt)*) => {{
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, $($arg)*);
        let _ = out.flush();
    }};
}

/// Port offset of each node's metrics endpoint from its listening port.
const METRICS_OFFSET: usize = 100;

/// Starts the nodes, waits for Ctrl-C or SIGTERM, stops them.
pub fn run(args: UpArgs) -> Result<bool, String> {
    let protocol: Protocol = args.protocol.parse()?;
    if args.nodes == 0 {
        return Err("--nodes must be at least 1".into());
    }
    if CommitMode::parse(&args.oss_commit).is_none() {
        let names: Vec<&str> = CommitMode::NAMES.iter().map(|(n, _)| *n).collect();
        return Err(format!(
            "--oss-commit {:?} is not a commit mode ({})",
            args.oss_commit,
            names.join(", ")
        ));
    }
    let last = metrics_port(&args, args.nodes);
    if args.base_port == 0 || last > u16::MAX as usize {
        return Err(format!(
            "--base-port {} leaves no room for {} nodes and their metrics ports (up to {last})",
            args.base_port, args.nodes
        ));
    }
    fs::create_dir_all(&args.dir)
        .map_err(|e| format!("cannot create {}: {e}", args.dir.display()))?;
    let secret: String = rand::random::<[u8; 32]>()
        .iter()
        .fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        });
    // Absolute, so that the files name each other wherever a node is started from.
    let dir = fs::canonicalize(&args.dir)
        .map_err(|e| format!("cannot find {}: {e}", args.dir.display()))?;
    let keys = Keys::generate(&dir, args.nodes)?;
    write_client_config(&dir, &args, &secret, &keys)?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut members = Vec::new();
    for id in 1..=args.nodes {
        let listen = loopback(listen_port(&args, id));
        let metrics = loopback(metrics_port(&args, id));
        let config = args.dir.join(format!("node-{id}.toml"));
        write_config(&config, &args, protocol, id, &secret, &keys)?;
        let log_path = args.dir.join(format!("node-{id}.log"));
        let log = File::create(&log_path)
            .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
        let child = Command::new(&exe)
            .arg("node")
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start node {id}: {e}"))?;
        say!(
            "node {id}: pid {} listening on {listen}, metrics http://{metrics}/metrics, config {}, log {}",
            child.id(),
            config.display(),
            log_path.display()
        );
        members.push(Member {
            id,
            child,
            listen,
            metrics,
            exited: false,
        });
    }
    say!(
        "clients connect with {} (its key: {}); `atomos status --client {}` shows the members",
        dir.join("client.toml").display(),
        dir.join("client.key").display(),
        dir.join("client.toml").display()
    );
    say!(
        "cluster of {} nodes ({protocol}) is up; Ctrl-C stops it.",
        members.len()
    );

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(watch(&mut members))?;
    stop(&mut members);
    say!("cluster stopped");
    Ok(true)
}

/// The cluster's generated keys: one per member, one client's.
struct Keys {
    /// Member i's key file and public key at i - 1.
    members: Vec<(PathBuf, KeyPair)>,
    client: KeyPair,
}

impl Keys {
    /// Makes the keys and writes them to `dir` (`node-N.key`, `client.key`), replacing older
    /// ones.
    fn generate(dir: &Path, nodes: usize) -> Result<Keys, String> {
        let write = |name: String, what: &str| -> Result<(PathBuf, KeyPair), String> {
            let keys = KeyPair::generate().map_err(|e| e.to_string())?;
            let path = dir.join(name);
            atomos::config::write_key_file(&path, &keys, what, true)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            Ok((path, keys))
        };
        let members = (1..=nodes)
            .map(|id| write(format!("node-{id}.key"), &format!("member {id}")))
            .collect::<Result<Vec<_>, _>>()?;
        let (_, client) = write("client.key".into(), "client \"client\"")?;
        Ok(Keys { members, client })
    }
}

/// Writes `text` to `path`, readable by its owner only (it holds the secret).
fn write_private(path: &Path, text: &str) -> Result<(), String> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    // A file that existed keeps its mode through `open`: make it the owner's alone.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot restrict {}: {e}", path.display()))?;
    file.write_all(text.as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// `client.toml`: what a program needs to connect as the generated client.
/// A member as `client.toml` lists it.
#[derive(Serialize)]
struct ClientsMember {
    id: usize,
    address: String,
    public_key: String,
}

/// `client.toml`: what a program needs to connect as the cluster's client.
#[derive(Serialize)]
struct ClientFile<'a> {
    cluster: &'a str,
    secret: &'a str,
    key_file: &'a str,
    members: Vec<ClientsMember>,
}

/// A peer as a node's configuration lists it.
#[derive(Serialize)]
struct PeerEntry {
    id: usize,
    address: String,
    public_key: String,
}

/// A client the members admit.
#[derive(Serialize)]
struct ClientEntry<'a> {
    name: &'a str,
    public_key: String,
}

/// A node's configuration file (the keys `atomos node` reads; see `atomos::config`).
#[derive(Serialize)]
struct NodeFile<'a> {
    cluster: &'a str,
    node_id: usize,
    listen: String,
    data_dir: String,
    secret: &'a str,
    key_file: String,
    protocol: String,
    log_level: &'a str,
    metrics: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    order: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    order_load_clients: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bank_load_threads: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    oss_commit: Option<&'a str>,
    peers: Vec<PeerEntry>,
    clients: Vec<ClientEntry<'a>>,
}

/// Node `id`'s listening port (1-based).
fn listen_port(args: &UpArgs, id: usize) -> usize {
    args.base_port as usize + id - 1
}

/// Node `id`'s metrics port: past every node's listening port (100 past its own, for up to
/// 100 nodes).
fn metrics_port(args: &UpArgs, id: usize) -> usize {
    listen_port(args, id) + args.nodes.max(METRICS_OFFSET)
}

/// A loopback address on `port`.
fn loopback(port: usize) -> String {
    format!("127.0.0.1:{port}")
}

/// Writes `value` as TOML to `path`, readable by its owner only.
fn write_toml(path: &Path, value: &impl Serialize) -> Result<(), String> {
    let text = toml::to_string(value)
        .map_err(|e| format!("cannot write {} as TOML: {e}", path.display()))?;
    write_private(path, &text)
}

fn write_client_config(dir: &Path, args: &UpArgs, secret: &str, keys: &Keys) -> Result<(), String> {
    let members = keys
        .members
        .iter()
        .enumerate()
        .map(|(i, (_, key))| ClientsMember {
            id: i + 1,
            address: loopback(listen_port(args, i + 1)),
            public_key: key.public().to_string(),
        })
        .collect();
    let file = ClientFile {
        cluster: "loopback",
        secret,
        key_file: "client.key",
        members,
    };
    write_toml(&dir.join("client.toml"), &file)
}

fn write_config(
    path: &Path,
    args: &UpArgs,
    protocol: Protocol,
    id: usize,
    secret: &str,
    keys: &Keys,
) -> Result<(), String> {
    let peers = (1..=args.nodes)
        .map(|n| PeerEntry {
            id: n,
            address: loopback(listen_port(args, n)),
            public_key: keys.members[n - 1].1.public().to_string(),
        })
        .collect();
    let file = NodeFile {
        cluster: "loopback",
        node_id: id,
        listen: loopback(listen_port(args, id)),
        data_dir: args
            .dir
            .join("data")
            .join(id.to_string())
            .display()
            .to_string(),
        secret,
        key_file: keys.members[id - 1].0.display().to_string(),
        protocol: protocol.to_string(),
        log_level: "info",
        metrics: loopback(metrics_port(args, id)),
        order: args.order.then_some(true),
        order_load_clients: args.order.then_some(args.order_load),
        bank_load_threads: (args.bank_load > 0).then_some(args.bank_load),
        oss_commit: (protocol == Protocol::Oss).then_some(args.oss_commit.as_str()),
        peers,
        clients: vec![ClientEntry {
            name: "client",
            public_key: keys.client.public().to_string(),
        }],
    };
    write_toml(path, &file)
}

/// Reports nodes that exit on their own until Ctrl-C, SIGTERM or SIGHUP (its terminal
/// closed: the nodes, which reload their keys on SIGHUP, must not outlive it).
async fn watch(members: &mut [Member]) -> Result<(), String> {
    let mut terminate =
        signal(SignalKind::terminate()).map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
    let mut interrupt =
        signal(SignalKind::interrupt()).map_err(|e| format!("cannot watch SIGINT: {e}"))?;
    let mut hangup =
        signal(SignalKind::hangup()).map_err(|e| format!("cannot watch SIGHUP: {e}"))?;
    loop {
        tokio::select! {
            _ = terminate.recv() => return Ok(()),
            _ = interrupt.recv() => return Ok(()),
            _ = hangup.recv() => return Ok(()),
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        for m in members.iter_mut().filter(|m| !m.exited) {
            if let Ok(Some(status)) = m.child.try_wait() {
                m.exited = true;
                say!(
                    "node {} ({} / {}) exited: {status}",
                    m.id,
                    m.listen,
                    m.metrics
                );
            }
        }
    }
}

/// SIGTERM to every node still running; SIGKILL to those still there after 5 s.
fn stop(members: &mut [Member]) {
    for m in members.iter().filter(|m| !m.exited) {
        if let Ok(pid) = i32::try_from(m.child.id()) {
            // SAFETY: kill(2) on a child we started and have not reaped; no memory involved.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for m in members.iter_mut() {
        loop {
            match m.child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() >= deadline => {
                    say!("node {} did not stop in time: killing it", m.id);
                    let _ = m.child.kill();
                    let _ = m.child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(nodes: usize) -> UpArgs {
        UpArgs {
            nodes,
            protocol: "local".into(),
            base_port: 7401,
            dir: PathBuf::from("unused"),
            order: false,
            order_load: 0,
            bank_load: 0,
            oss_commit: "ultra-peer".into(),
        }
    }

    /// With more than 100 nodes, no node's metrics port is another's listening port.
    #[test]
    fn every_port_is_used_once_whatever_the_number_of_nodes() {
        for nodes in [1, 3, 100, 101, 250] {
            let a = args(nodes);
            let mut ports: Vec<usize> = (1..=nodes)
                .flat_map(|id| [listen_port(&a, id), metrics_port(&a, id)])
                .collect();
            ports.sort_unstable();
            ports.dedup();
            assert_eq!(ports.len(), 2 * nodes, "{nodes} nodes");
        }
        // Up to 100 nodes the metrics port stays 100 past the listening one.
        assert_eq!(metrics_port(&args(3), 2), 7502);
    }
}
