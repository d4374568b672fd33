//! Bad input at the command line: every entry of a table of wrong flags, values and files
//! gets a clear error and exit status 2, never a panic, a hang or an allocation the size of
//! the number typed.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The binary under test.
const ATOMOS: &str = env!("CARGO_BIN_EXE_atomos");

/// Each entry: the arguments, and a word the error must contain.
const BAD: &[(&str, &str)] = &[
    ("status --client /nonexistent/client.toml", "--client"),
    ("status --client client.toml --wait 0", "--wait"),
    ("status --client client.toml --wait 1e12", "--wait"),
    ("status --client client.toml --wait nan", "--wait"),
    ("status", "--client"),
    ("member list --client /nonexistent/client.toml", "--client"),
    ("member list --client client.toml --wait 0", "--wait"),
    ("member promote --client client.toml", "--id"),
    ("member promote --client client.toml --id x", "--id"),
    ("member add --client client.toml --id 4 --address 127.0.0.1:1", "--public-key"),
    (
        "member add --client client.toml --id 4 --address nowhere --public-key ab",
        "--address",
    ),
    (
        "member add --client client.toml --id 4 --address 127.0.0.1:1 --public-key zz",
        "--public-key",
    ),
    ("member remove --client client.toml --id 3 --wait -1", "--wait"),
    ("demo --protocol Certify", "--protocol"),
    ("cluster up --nodes -1", "--nodes"),
    ("cluster up --protocol Certify", "--protocol"),
    ("cluster up --nodes 1000 --base-port 65000", "--base-port"),
    ("cluster up --oss-commit token", "--oss-commit"),
    ("bench bank --seed -1 --duration 0.1", "--seed"),
    ("bench bank --transport udp --duration 0.1", "--transport"),
    ("bench tpcc --mix heavy --duration 0.1", "--mix"),
    ("bench tpcc --scale huge --duration 0.1", "--scale"),
    ("bench bank --nesting deep --duration 0.1", "--nesting"),
    ("bench bank --sched fifo --duration 0.1", "--sched"),
    ("demo --duration 0", "--duration"),
    ("demo --threads 0", "--threads"),
    ("demo --threads 100000", "--threads"),
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

/// Runs `atomos keygen --out path` with `args` (replacing an older file); returns the public
/// key it printed.
fn keygen(path: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new(ATOMOS)
        .args(["keygen", "--force", "--out"])
        .arg(path)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("public key: "))
        .unwrap_or_else(|| panic!("no public key printed:\n{text}"))
        .to_string()
}

#[test]
fn keygen_writes_a_private_file_and_never_overwrites_one_unasked() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("atomos-keygen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("client.key");
    let _ = std::fs::remove_file(&path);
    let out = Command::new(ATOMOS)
        .args(["keygen", "--client", "app", "--out"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        printed.contains("[[clients]]") && printed.contains("name = \"app\""),
        "{printed}"
    );
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let written = std::fs::read_to_string(&path).unwrap();
    // Again without --force: refused, the key kept.
    let out = Command::new(ATOMOS)
        .args(["keygen", "--out"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), written);
    // The private key is in the file, never on the screen.
    let private = written
        .lines()
        .find_map(|l| l.strip_prefix("private_key = "))
        .unwrap()
        .trim_matches('"');
    assert!(!printed.contains(private));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_configuration_readable_by_others_holding_the_secret_is_warned_about() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("atomos-exposed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("node.toml");
    let own = dir.join("node-1.key");
    keygen(&own, &["--member", "1"]);
    let two = keygen(&dir.join("node-2.key"), &["--member", "2"]);
    std::fs::write(
        &path,
        format!(
            "node_id = 1\nsecret = \"0123456789abcdef0123456789abcdef\"\nkey_file = {:?}\n\
             [[peers]]\nid = 2\naddress = \"127.0.0.1:7402\"\npublic_key = \"{two}\"\n",
            own.display().to_string()
        ),
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
