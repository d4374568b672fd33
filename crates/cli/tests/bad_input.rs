//! Bad input at the command line: every entry of a table of wrong flags, values and files
//! gets a clear error and exit status 2, never a panic, a hang or an allocation the size of
//! the number typed.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The binary under test.
const ATOMOS: &str = env!("CARGO_BIN_EXE_atomos");

/// Each entry: the arguments, and a word the error must contain.
const BAD: &[(&str, &str)] = &[
    ("bench bank --duration 1e20", "--duration"),
    ("bench bank --duration nan", "--duration"),
    ("bench bank --duration 0", "--duration"),
    ("bench bank --duration -1", "-1"),
    ("bench bank --threads 0 --duration 0.1", "--threads"),
    ("bench bank --objects 1 --duration 0.1", "--objects"),
    ("bench bank --read-ratio 2 --duration 0.1", "--read-ratio"),
    ("bench bank --nodes 0 --duration 0.1", "--nodes"),
    (
        "bench bank --protocol tfa --nodes 1000000 --duration 0.1",
        "--nodes",
    ),
    ("bench bank --protocol nosuch --duration 0.1", "protocol"),
    ("bench nosuch --duration 0.1", "nosuch"),
    (
        "bench net --duration 0.3 --link-delay-ms 1e300",
        "--link-delay-ms",
    ),
    (
        "bench net --duration 0.3 --message-bytes 0",
        "--message-bytes",
    ),
    (
        "bench net --duration 0.3 --message-bytes 99999999999",
        "--message-bytes",
    ),
    ("bench order --nodes 0 --duration 0.1", "--nodes"),
    ("bench order --nodes 1000000 --duration 0.1", "--nodes"),
    (
        "bench order --nodes 3 --duration 0.1 --fsync bogus",
        "--fsync",
    ),
    (
        "bench order --nodes 3 --duration 1 --kill-leader-every 1e20",
        "--kill-leader-every",
    ),
    (
        "bench bank --sweep bogus=1 --duration 0.1 --json /tmp/x.json",
        "bogus",
    ),
    ("bench tpcc --warehouses 0 --duration 0.1", "--warehouses"),
    (
        "bench bank --protocol tfa --nodes 2 --processes --duration 0.1",
        "--transport tcp",
    ),
    ("bench bank --processes --duration 0.1", "local"),
    ("bench net --processes --duration 0.1", "--processes"),
    (
        "bench hashtable --protocol tfa --nodes 2 --transport tcp --processes --duration 0.1",
        "one process",
    ),
    (
        "bench bank --protocol tfa --nodes 2 --transport tcp --processes --sweep threads=1,2 --duration 0.1 --json /tmp/x.json",
        "--sweep",
    ),
    (
        "bench bank --protocol tfa --nodes 2 --transport tcp --member 5 --duration 0.1",
        "member 5",
    ),
    (
        "bench bank --protocol tfa --nodes 2 --answer-poll-us 2000000 --duration 0.1",
        "--answer-poll-us",
    ),
    (
        "bench bank --protocol tfa --nodes 2 --answer-poll-us -1 --duration 0.1",
        "-1",
    ),
    (
        "bench bank --protocol tfa --nodes 2 --transport tcp --busy-poll-us 2000000 --duration 0.1",
        "--busy-poll-us",
    ),
    (
        "bench bank --protocol tfa --nodes 2 --transport tcp --runtime-threads 0 --duration 0.1",
        "--runtime-threads",
    ),
    ("bench net --runtime-threads 4 --duration 0.1", "--runtime-threads"),
    ("demo --duration 1e20", "--duration"),
    ("demo --threads 0 --duration 0.1", "--threads"),
    ("report /nonexistent/result.json --out /tmp", "/nonexistent"),
    (
        "check-config --config /nonexistent/node.toml",
        "/nonexistent",
    ),
    ("node --config /nonexistent/node.toml", "/nonexistent"),
    ("cluster up --nodes 0", "--nodes"),
    ("cluster up --nodes 3 --base-port 65534", "--base-port"),
    (
        "cluster up --protocol oss --oss-commit lottery",
        "--oss-commit",
    ),
    ("nosuch", "nosuch"),
];

#[test]
fn bad_input_is_a_clear_error_with_status_2_and_never_a_panic() {
    let mut wrong = Vec::new();
    for (args, word) in BAD {
        let mut child = Command::new(ATOMOS)
            .args(args.split_whitespace())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                wrong.push(format!("`atomos {args}` did not end in 20 s"));
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        if text.contains("panicked") {
            wrong.push(format!("`atomos {args}` panicked:\n{text}"));
        } else if out.status.code() != Some(2) {
            wrong.push(format!(
                "`atomos {args}` exited with {:?}:\n{text}",
                out.status.code()
            ));
        } else if !text.contains(word) {
            wrong.push(format!("`atomos {args}` did not name {word:?}:\n{text}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

#[test]
fn a_configuration_readable_by_others_holding_the_secret_is_warned_about() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("atomos-exposed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("node.toml");
    std::fs::write(
        &path,
        "node_id = 1\nsecret = \"0123456789abcdef0123456789abcdef\"\n[[peers]]\nid = 2\naddress = \"127.0.0.1:7402\"\n",
    )
    .unwrap();
    let check = |mode| {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let out = Command::new(ATOMOS)
            .args(["check-config", "--config"])
            .arg(&path)
            .env_remove("ATOMOS_SECRET")
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(check(0o644).contains("chmod 600"));
    assert!(!check(0o600).contains("chmod 600"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_metrics_endpoint_is_on_loopback_unless_an_address_says_otherwise() {
    let check = |metrics: &str| {
        let out = Command::new(ATOMOS)
            .arg("check-config")
            .env("ATOMOS_SECRET", "0123456789abcdef0123456789abcdef")
            .env("ATOMOS_METRICS", metrics)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (settings, warnings) = check("9401");
    assert!(settings.contains("127.0.0.1:9401"), "{settings}");
    assert!(!warnings.contains("metrics"), "{warnings}");
    let (settings, warnings) = check("0.0.0.0:9401");
    assert!(settings.contains("0.0.0.0:9401"), "{settings}");
    assert!(warnings.contains("no authentication"), "{warnings}");
}
