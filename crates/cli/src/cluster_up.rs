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
const METRICS_OFFSET: u16 = 100;

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
    let last = args.base_port as usize + args.nodes - 1 + METRICS_OFFSET as usize;
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
        let port = args.base_port + id as u16 - 1;
        let listen = format!("127.0.0.1:{port}");
        let metrics = format!("127.0.0.1:{}", port + METRICS_OFFSET);
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
        "clients connect with {} (its key: {})",
        dir.join("client.toml").display(),
        dir.join("client.key").display()
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
fn write_client_config(dir: &Path, args: &UpArgs, secret: &str, keys: &Keys) -> Result<(), String> {
    let mut text = String::new();
    let _ = writeln!(text, "cluster = \"loopback\"");
    let _ = writeln!(text, "secret = \"{secret}\"");
    let _ = writeln!(text, "key_file = \"client.key\"");
    for (i, (_, key)) in keys.members.iter().enumerate() {
        let _ = writeln!(
            text,
            "\n[[members]]\nid = {}\naddress = \"127.0.0.1:{}\"\npublic_key = \"{}\"",
            i + 1,
            args.base_port as usize + i,
            key.public()
        );
    }
    write_private(&dir.join("client.toml"), &text)
}

fn write_config(
    path: &Path,
    args: &UpArgs,
    protocol: Protocol,
    id: usize,
    secret: &str,
    keys: &Keys,
) -> Result<(), String> {
    let mut text = String::new();
    let port = |n: usize| args.base_port as usize + n - 1;
    let _ = writeln!(text, "cluster = \"loopback\"");
    let _ = writeln!(text, "node_id = {id}");
    let _ = writeln!(text, "listen = \"127.0.0.1:{}\"", port(id));
    let data = args.dir.join("data").join(id.to_string());
    let _ = writeln!(text, "data_dir = {:?}", data.display().to_string());
    let _ = writeln!(text, "secret = \"{secret}\"");
    let key_file = keys.members[id - 1].0.display().to_string();
    let _ = writeln!(text, "key_file = {key_file:?}");
    let _ = writeln!(text, "protocol = \"{protocol}\"");
    let _ = writeln!(text, "log_level = \"info\"");
    let metrics = port(id) + METRICS_OFFSET as usize;
    let _ = writeln!(text, "metrics = \"127.0.0.1:{metrics}\"");
    if args.order {
        let _ = writeln!(text, "order = true");
        let _ = writeln!(text, "order_load_clients = {}", args.order_load);
    }
    if args.bank_load > 0 {
        let _ = writeln!(text, "bank_load_threads = {}", args.bank_load);
    }
    if protocol == Protocol::Oss {
        let _ = writeln!(text, "oss_commit = \"{}\"", args.oss_commit);
    }
    for n in 1..=args.nodes {
        let _ = writeln!(
            text,
            "\n[[peers]]\nid = {n}\naddress = \"127.0.0.1:{}\"\npublic_key = \"{}\"",
            port(n),
            keys.members[n - 1].1.public()
        );
    }
    let _ = writeln!(
        text,
        "\n[[clients]]\nname = \"client\"\npublic_key = \"{}\"",
        keys.client.public()
    );
    write_private(path, &text)
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
