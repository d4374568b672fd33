//! What the process tests share: starting `atomos cluster up`, signalling and waiting for
//! processes.

// Each test binary uses a part of what is here.
#![allow(dead_code)]

pub mod bank;
pub mod dashboard;
pub mod members;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The binary under test.
pub const ATOMOS: &str = env!("CARGO_BIN_EXE_atomos");

/// Sends `sig` to process `pid`.
pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a process the test started.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// Kills process `pid` with SIGKILL and waits (up to 10 s) until it holds no files or ports:
/// it is gone, or only its main thread is left, a zombie its parent has not reaped yet (the
/// main thread turns zombie while its other threads may still be ending, their files open: a
/// node started again before then could not listen on its port).
pub fn kill_dead(pid: u32) {
    signal(pid, libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The state follows the command's closing parenthesis: "PID (COMM) S ...".
        let state = stat
            .rsplit(") ")
            .next()
            .and_then(|rest| rest.chars().next());
        let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());
        if state.is_none() || (matches!(state, Some('Z' | 'X')) && threads <= 1) {
            return;
        }
        assert!(Instant::now() < deadline, "process {pid} outlived SIGKILL");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for `child` to exit (killing it and failing after `within`).
pub fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("process {} did not exit in time", child.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts `atomos cluster up --nodes N --base-port B --dir DIR EXTRA...` and returns it with
/// the node processes' ids, read from what it prints.
pub fn cluster_up(nodes: usize, base_port: u16, dir: &Path, extra: &[&str]) -> (Child, Vec<u32>) {
    cluster_up_with(nodes, base_port, dir, extra, &[])
}

/// [`cluster_up`] with environment variables for the nodes (configuration overrides).
pub fn cluster_up_with(
    nodes: usize,
    base_port: u16,
    dir: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Child, Vec<u32>) {
    let mut up = Command::new(ATOMOS)
        .args(["cluster", "up", "--nodes"])
        .arg(nodes.to_string())
        .arg("--base-port")
        .arg(base_port.to_string())
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pids = Vec::new();
    let mut lines = BufReader::new(up.stdout.take().unwrap()).lines();
    while pids.len() < nodes {
        let line = lines.next().expect("cluster up printed its nodes").unwrap();
        let pid: u32 = line
            .split("pid ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no pid in {line:?}"));
        pids.push(pid);
    }
    // Keep reading what it prints, so its later lines do not meet a closed pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (up, pids)
}

/// The node (0-based) whose log announced the highest term as leader, with that term. `logs`
/// pairs each log file with its node.
pub fn leader(logs: &[(usize, PathBuf)]) -> Option<(usize, u64)> {
    let mut best: Option<(usize, u64)> = None;
    for (i, log) in logs {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        for line in text.lines().filter(|l| l.contains("became leader at term")) {
            let term = line
                .split("became leader at term ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|t| t.parse::<u64>().ok());
            if let Some(t) = term {
                if best.is_none_or(|(_, b)| t > b) {
                    best = Some((*i, t));
                }
            }
        }
    }
    best
}

/// Starts node `node` (0-based) again from its configuration in `dir`, logging to
/// `node-N-restart-ROUND.log`.
pub fn restart(dir: &Path, node: usize, round: usize) -> (Child, PathBuf) {
    restart_with(dir, node, round, &[])
}

/// [`restart`] with environment variables for the node (configuration overrides).
pub fn restart_with(
    dir: &Path,
    node: usize,
    round: usize,
    env: &[(&str, &str)],
) -> (Child, PathBuf) {
    let log = dir.join(format!("node-{}-restart-{round}.log", node + 1));
    let child = Command::new(ATOMOS)
        .envs(env.iter().copied())
        .args(["node", "--config"])
        .arg(dir.join(format!("node-{}.toml", node + 1)))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    (child, log)
}

/// Kills the processes if the test fails half-way, so none outlives it.
pub struct KillOnDrop(pub Vec<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for &pid in &self.0 {
                signal(pid, libc::SIGKILL);
            }
        }
    }
}

/// Sends `GET path` to 127.0.0.1:`port` and returns the whole answer.
pub fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
}

/// The sum of a metric's samples (every label set) in a Prometheus text answer.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A base port for a cluster of `nodes` whose node ports (`base..base+nodes`) and metrics ports
/// (`base+100..`) are all free now. Chosen below the kernel's ephemeral range (32768 and up on
/// Linux), so no outgoing connection of another process takes one between this check and the
/// nodes' start; each call in a test binary gets its own range, so tests running side by side
/// never share one.
pub fn free_base_port(nodes: usize) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CALLS: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 10_000;
    const SPAN: u32 = 22_000; // up to 32,000 plus the metrics offset
    const STRIDE: u32 = 211; // more than the metrics offset and any cluster's size
    let start = std::process::id().wrapping_mul(7_919) % SPAN;
    for _ in 0..200 {
        let call = CALLS.fetch_add(1, Ordering::Relaxed);
        let base = LOW + (start + call * STRIDE) % SPAN;
        let ports = (0..nodes as u32).flat_map(|i| [base + i, base + 100 + i]);
        let free = ports
            .into_iter()
            .all(|p| std::net::TcpListener::bind(("127.0.0.1", p as u16)).is_ok());
        if free {
            return base as u16;
        }
    }
    panic!("no free range of ports for {nodes} nodes");
}

/// Waits until `path` has a line, after its first `skip` lines, containing every one of
/// `needles`; returns that line's index.
pub fn wait_for_line(path: &Path, skip: usize, needles: &[&str]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(i) = text
            .lines()
            .enumerate()
            .skip(skip)
            .find(|(_, l)| needles.iter().all(|n| l.contains(n)))
            .map(|(i, _)| i)
        {
            return i;
        }
        assert!(
            Instant::now() < deadline,
            "{} never logged {needles:?}:\n{text}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The `public_key = "..."` line's key in a key file.
pub fn public_key_of(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("public_key = "))
        .expect("a key file names its public key")
        .trim_matches('"')
        .to_string()
}
