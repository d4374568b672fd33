//! The protocol crates are deterministic state machines: no file, socket, clock, thread or
//! unseeded randomness in their code or their dependencies. This test reads their sources and
//! manifests and fails on anything that would give them I/O of their own.

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
fn the_check_finds_what_it_looks_for() {
    // A line with a forbidden name is caught; the same name in a comment is not.
    let line = "let t = std::time::Instant::now(); // not std::fs";
    assert!(code(line).contains("Instant"));
    assert!(!code(line).contains("std::fs"));
}
