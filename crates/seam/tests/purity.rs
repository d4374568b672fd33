//! The protocol crates are deterministic state machines: no file, socket, clock, thread or
//! unseeded randomness in their code or their dependencies. This test reads their sources and
//! manifests and fails on anything that would give them I/O of their own; it asks cargo for
//! every crate they depend on, however indirectly, and fails on one that does I/O unless it is
//! listed below with the crate that brings it and why that is safe.

use std::path::{Path, PathBuf};

/// Crates that must stay pure, relative to the workspace's `crates/`.
const PURE: &[&str] = &["seam", "order", "protocols"];

/// What pure code must not name (in code, not comments), and why.
const FORBIDDEN: &[(&str, &str)] = &[
    ("std::fs", "files"),
    ("File::", "files"),
    ("std::net", "sockets"),
    ("TcpStream", "sockets"),
    ("UdpSocket", "sockets"),
    ("std::thread", "threads"),
    ("thread::spawn", "threads"),
    ("Instant", "clocks"),
    ("SystemTime", "clocks"),
    ("std::time::", "clocks"),
    ("rand::", "unseeded randomness"),
    ("thread_rng", "unseeded randomness"),
    ("getrandom", "unseeded randomness"),
    ("OsRng", "unseeded randomness"),
    ("RandomState", "randomly seeded hashing (iteration order)"),
    ("HashMap::new", "randomly seeded hashing (use FxHashMap)"),
    ("HashSet::new", "randomly seeded hashing (use FxHashSet)"),
    (
        "collections::HashMap",
        "randomly seeded hashing (use FxHashMap)",
    ),
    (
        "collections::HashSet",
        "randomly seeded hashing (use FxHashSet)",
    ),
    ("tokio", "an async runtime"),
    ("std::env", "the environment"),
    ("std::process", "processes"),
];

/// Dependencies pure crates must not have.
const FORBIDDEN_DEPS: &[&str] = &["tokio", "rand", "getrandom", "mio", "socket2", "libc"];

/// Crates that do I/O of their own (an async runtime, sockets, OS randomness, signal handling,
/// logging threads): none may be in a pure crate's dependencies, however indirect, unless
/// [`ACCEPTED`] says who brings it.
const IO_CRATES: &[&str] = &[
    "tokio",
    "mio",
    "socket2",
    "signal-hook-registry",
    "rand",
    "rand_chacha",
    "getrandom",
    "slog-async",
    "slog-term",
    "slog-envlogger",
];

/// I/O crates accepted in pure crates' dependencies: (the crate, the crate that depends on it,
/// why it cannot act here).
const ACCEPTED: &[(&str, &str, &str)] = &[
    (
        "rand",
        "raft",
        "raft-rs draws election timeouts from it; the replica gives it a range of one value \
         and adds its own seeded jitter",
    ),
    ("rand_chacha", "rand", "rand's generator, under raft's"),
    (
        "getrandom",
        "rand_core",
        "turned on by raft's rand; pure code may not name it or OsRng (see FORBIDDEN)",
    ),
];

/// Each line of `cargo tree --prefix depth` output as (depth, crate name).
fn tree_lines(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .filter_map(|line| {
            let digits = line.chars().take_while(char::is_ascii_digit).count();
            let depth = line[..digits].parse().ok()?;
            let name = line[digits..].split_whitespace().next()?.to_string();
            Some((depth, name))
        })
        .collect()
}

/// The I/O crates in a dependency tree (as [`tree_lines`] gives it) that [`ACCEPTED`] does
/// not cover, each with the chain of crates that brings it.
fn unaccepted_io(lines: &[(usize, String)]) -> Vec<String> {
    let mut path: Vec<&str> = Vec::new();
    let mut found = Vec::new();
    for (depth, name) in lines {
        path.truncate(*depth);
        let parent = path.last().copied().unwrap_or("");
        path.push(name);
        let accepted = ACCEPTED
            .iter()
            .any(|(krate, by, _)| krate == name && *by == parent);
        if IO_CRATES.contains(&name.as_str()) && !accepted {
            found.push(path.join(" -> "));
        }
    }
    found.sort();
    found.dedup();
    found
}

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crates/")
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The line without its `//` comment (string literals with `//` are rare enough here).
fn code(line: &str) -> &str {
    line.split("//").next().unwrap_or("")
}

#[test]
fn protocol_crates_do_no_io() {
    let mut found = Vec::new();
    for krate in PURE {
        let mut files = Vec::new();
        rust_files(&crates_dir().join(krate).join("src"), &mut files);
        assert!(!files.is_empty(), "no sources found for {krate}");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            // Unit tests inside a source file may use what they like.
            let body = text.split("#[cfg(test)]").next().unwrap_or("");
            for (n, line) in body.lines().enumerate() {
                for (pattern, what) in FORBIDDEN {
                    if code(line).contains(pattern) {
                        found.push(format!(
                            "{}:{}: {what} ({pattern}): {}",
                            file.display(),
                            n + 1,
                            line.trim()
                        ));
                    }
                }
            }
        }
        let manifest =
            std::fs::read_to_string(crates_dir().join(krate).join("Cargo.toml")).unwrap();
        let deps = manifest
            .split("[dependencies]")
            .nth(1)
            .unwrap_or("")
            .split("\n[")
            .next()
            .unwrap_or("");
        // A dependency's name: what a line says before its `=` or `.workspace` (so `rand`
        // is caught and `rand_core`, a trait crate without a source of its own, is not).
        let names: Vec<&str> = deps
            .lines()
            .filter_map(|l| l.split(['=', '.']).next())
            .map(str::trim)
            .collect();
        for dep in FORBIDDEN_DEPS {
            if names.contains(dep) {
                found.push(format!("{krate}/Cargo.toml depends on {dep}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "I/O in protocol crates:\n{}",
        found.join("\n")
    );
}

#[test]
fn protocol_crates_depend_on_nothing_that_does_io() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut found = Vec::new();
    for krate in PURE {
        let package = format!("atomos-{krate}");
        let output = std::process::Command::new(&cargo)
            .args(["tree", "--offline", "-e", "normal", "--prefix", "depth"])
            .args(["--no-dedupe", "-p", &package])
            .current_dir(crates_dir())
            .output()
            .expect("cargo runs");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "cargo tree -p {package} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let lines = tree_lines(&text);
        assert!(lines.len() > 1, "no dependencies listed for {package}");
        found.extend(unaccepted_io(&lines));
    }
    assert!(
        found.is_empty(),
        "protocol crates depend on crates that do I/O:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_dependency_check_finds_an_io_crate_however_deep_and_accepts_only_its_listed_bringer() {
    let tree = "0atomos-protocols v0\n1atomos-core v0\n2atomos-sched v0\n3tokio v1\n\
                1raft v0.7\n2rand v0.8\n3rand_chacha v0.3\n1mystery v1\n2rand v0.8\n";
    assert_eq!(
        unaccepted_io(&tree_lines(tree)),
        vec![
            "atomos-protocols -> atomos-core -> atomos-sched -> tokio".to_string(),
            "atomos-protocols -> mystery -> rand".to_string(),
        ]
    );
}

#[test]
fn the_check_finds_what_it_looks_for() {
    // A line with a forbidden name is caught; the same name in a comment is not.
    let line = "let t = std::time::Instant::now(); // not std::fs";
    assert!(code(line).contains("Instant"));
    assert!(!code(line).contains("std::fs"));
}
