//! Data written by earlier builds opens with this one.
//!
//! `tests/fixtures/<format>/<protocol>/` holds a one-member cluster's data directory as a build
//! of that format left it: write-ahead logs and snapshots, values of a declared type, procedure
//! invocations in the log. [`every_fixture_opens_with_this_build`] copies each one, starts a
//! node on it, and checks every object and that the node goes on committing. A change of an
//! on-disk format adds a new fixture directory and keeps reading the old ones: a fixture is
//! never rewritten (see `tests/fixtures/README.md`).
//!
//! `ATOMOS_WRITE_FIXTURES=DIR cargo test -p atomos --test fixtures -- --ignored
//! write_fixtures` writes this build's fixtures into `DIR`.

mod one_node;

use std::path::{Path, PathBuf};

use atomos::{NodeRuntime, ProcedureKind, Procedures, TRef, Tx, TxError};
use atomos_protocols::oss::OssRecord;
use serde::{Deserialize, Serialize};

/// The protocols that keep data on disk.
const PROTOCOLS: [&str; 4] = ["certify", "active", "oss", "tfa"];

/// Accounts the fixtures hold.
const ACCOUNTS: u32 = 40;

/// The stored type the fixtures hold. Its shape is part of the fixtures: change it only as the
/// rules in docs/guide/stored-types.md allow.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, atomos::Object)]
#[atomos(name = "fixture.Account")]
struct Account {
    owner: String,
    balance: i64,
    tags: Vec<String>,
    closed: Option<u64>,
}

fn account(i: u32) -> TRef<Account> {
    TRef::new(format!("account/{i}"))
}

fn ledger() -> TRef<Vec<u64>> {
    TRef::new("ledger")
}

/// Opens account `i`.
fn open(tx: &mut Tx<'_>, i: &u32) -> Result<(), TxError> {
    tx.create(
        &account(*i),
        Account {
            owner: format!("owner-{i}"),
            balance: *i as i64 * 10,
            tags: vec![format!("t{}", i % 4)],
            closed: None,
        },
    )
}

/// Adds `amount` to account `i` and appends `i` to the ledger.
fn deposit(tx: &mut Tx<'_>, args: &(u32, i64)) -> Result<(), TxError> {
    let (i, amount) = *args;
    tx.modify(&account(i), |a| a.balance += amount)?;
    if tx.exists(&ledger())? {
        tx.modify(&ledger(), |l| l.push(i as u64))
    } else {
        tx.create(&ledger(), vec![i as u64])
    }
}

/// Closes account `i` at time `at`.
fn close(tx: &mut Tx<'_>, args: &(u32, u64)) -> Result<(), TxError> {
    tx.modify(&account(args.0), |a| a.closed = Some(args.1))
}

/// Counts one in `tick/{name}` (a node that answers is ready).
fn tick(tx: &mut Tx<'_>, name: &String) -> Result<(), TxError> {
    let t: TRef<u64> = TRef::new(format!("tick/{name}"));
    if tx.exists(&t)? {
        tx.modify(&t, |v| *v += 1)
    } else {
        tx.create(&t, 1)
    }
}

fn procedures() -> Procedures {
    let p = Procedures::new();
    p.register("open", ProcedureKind::Update, open).unwrap();
    p.register("deposit", ProcedureKind::Update, deposit)
        .unwrap();
    p.register("close", ProcedureKind::Update, close).unwrap();
    p.register("tick", ProcedureKind::Update, tick).unwrap();
    p
}

/// What account `i` holds after the fixture's writes.
fn expected(i: u32) -> Account {
    Account {
        owner: format!("owner-{i}"),
        balance: i as i64 * 10 + if i.is_multiple_of(3) { 7 } else { 0 },
        tags: vec![format!("t{}", i % 4)],
        closed: i.is_multiple_of(10).then_some(1_000 + i as u64),
    }
}

fn expected_ledger() -> Vec<u64> {
    (0..ACCOUNTS)
        .filter(|i| i % 3 == 0)
        .map(u64::from)
        .collect()
}

/// Starts member 1 of a one-member cluster on `dir` and waits until it commits a procedure
/// on the object `tick/{run}`.
fn start(protocol: &str, dir: &Path, run: &str) -> (tokio::runtime::Runtime, NodeRuntime) {
    let rt = one_node::runtime();
    // Small snapshots and compactions: the fixtures hold a snapshot (`oss`: a compacted log)
    // and log entries after it.
    let s = one_node::settings(
        &format!("fixture-{protocol}"),
        protocol,
        one_node::free_address(),
        dir,
        &[
            ("ATOMOS_ORDER_SNAPSHOT_EVERY", "16"),
            ("ATOMOS_OSS_COMPACT_AFTER", "16"),
        ],
    );
    let node = rt
        .block_on(NodeRuntime::start_tcp_with(&s, procedures()))
        .unwrap();
    until_ticks(&node, run);
    (rt, node)
}

/// Waits until the node commits a procedure (it found its cluster and replayed its log).
fn until_ticks(node: &NodeRuntime, run: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match node.node().invoke::<String, ()>("tick", &run.to_string()) {
            Ok(()) => return,
            Err(e) if std::time::Instant::now() > deadline => panic!("never ready: {e}"),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    }
}

/// Writes this build's fixture for `protocol` into `dir`.
fn write_fixture(protocol: &str, dir: &Path) {
    let (_rt, node) = start(protocol, dir, "written");
    let n = node.node();
    for i in 0..ACCOUNTS {
        n.invoke::<u32, ()>("open", &i).unwrap();
    }
    for i in (0..ACCOUNTS).filter(|i| i % 3 == 0) {
        n.invoke::<(u32, i64), ()>("deposit", &(i, 7)).unwrap();
    }
    for i in (0..ACCOUNTS).filter(|i| i % 10 == 0) {
        n.invoke::<(u32, u64), ()>("close", &(i, 1_000 + i as u64))
            .unwrap();
    }
    check(protocol, &node);
    node.shutdown();
}

/// Checks every object of the fixture on `node`.
fn check(what: &str, node: &NodeRuntime) {
    let (accounts, ledger) = node
        .node()
        .atomically_read(|tx| {
            let accounts = (0..ACCOUNTS)
                .map(|i| tx.read(&account(i)).cloned())
                .collect::<Result<Vec<_>, TxError>>()?;
            Ok((accounts, tx.read(&ledger())?.clone()))
        })
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    for (i, a) in accounts.iter().enumerate() {
        assert_eq!(a, &expected(i as u32), "{what}: account {i}");
    }
    assert_eq!(ledger, expected_ledger(), "{what}: the ledger");
}

/// Checks that every object of the fixture is reported lost with node 1 (TFA, restarted).
fn check_lost(what: &str, node: &NodeRuntime) {
    for i in 0..ACCOUNTS {
        match node
            .node()
            .atomically_read(|tx| tx.read(&account(i)).map(|_| ()))
        {
            Err(TxError::Lost { key, node: 1 }) => assert_eq!(key, account(i).key().clone()),
            other => panic!("{what}: account {i}: {other:?}"),
        }
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// The records of the order replica's log `wal` (the replicated store's, under `certify` and
/// `active`).
fn order_records(wal: &Path) -> Vec<atomos::order::Record> {
    let bytes = std::fs::read(wal).unwrap();
    let parsed = atomos_seam::wal::parse(&bytes).unwrap();
    atomos::order::decode_log(parsed.records).unwrap()
}

fn fixtures_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

#[test]
fn every_fixture_opens_with_this_build() {
    let mut formats: Vec<PathBuf> = std::fs::read_dir(fixtures_root())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    formats.sort();
    assert!(
        !formats.is_empty(),
        "no fixtures under {:?}",
        fixtures_root()
    );
    for format in formats {
        for protocol in PROTOCOLS {
            let fixture = format.join(protocol);
            assert!(fixture.is_dir(), "{fixture:?} is missing");
            let what = format!(
                "{}/{protocol}",
                format.file_name().unwrap().to_string_lossy()
            );
            if protocol == "certify" || protocol == "active" {
                // The fixture holds a snapshot with log entries after it.
                let records = order_records(&fixture.join(format!("{protocol}.wal")));
                let image = records
                    .iter()
                    .position(|r| matches!(r, atomos::order::Record::ImageFollows { .. }))
                    .unwrap_or_else(|| panic!("{what}: no snapshot"));
                assert!(
                    records[image..]
                        .iter()
                        .any(|r| matches!(r, atomos::order::Record::Entries(_))),
                    "{what}: no entries after the snapshot"
                );
            }
            if protocol == "oss" && format.file_name().is_some_and(|f| f >= "v4") {
                // From v4 on the log was compacted: an image of the domain, then records.
                let bytes = std::fs::read(fixture.join("oss.wal")).unwrap();
                let parsed = atomos_seam::wal::parse(&bytes).unwrap();
                let records: Vec<OssRecord> = parsed
                    .records
                    .iter()
                    .map(|r| OssRecord::decode(r).unwrap())
                    .collect();
                let image = records
                    .iter()
                    .position(|r| matches!(r, OssRecord::Image(_)))
                    .unwrap_or_else(|| panic!("{what}: not compacted"));
                assert!(image + 1 < records.len(), "{what}: nothing after the image");
            }
            let dir = std::env::temp_dir().join(format!(
                "atomos-fixture-{}-{}",
                what.replace('/', "-"),
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            copy_dir(&fixture, &dir.join("node-1"));
            let (_rt, node) = start(protocol, &dir, "reopened");
            if protocol == "tfa" {
                // TFA keeps one copy, in memory: its log holds where objects live, so a
                // restarted node reports its objects lost rather than re-creating them.
                check_lost(&what, &node);
                node.shutdown();
                continue;
            }
            check(&what, &node);
            // It goes on: a new write lands beside the old ones.
            node.node()
                .invoke::<(u32, i64), ()>("deposit", &(1, 5))
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let balance = node
                .node()
                .atomically_read(|tx| Ok(tx.read(&account(1))?.balance))
                .unwrap();
            assert_eq!(balance, expected(1).balance + 5, "{what}");
            node.shutdown();
            drop(node);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

#[test]
#[ignore = "writes fixtures: ATOMOS_WRITE_FIXTURES=DIR"]
fn write_fixtures() {
    let root =
        PathBuf::from(std::env::var("ATOMOS_WRITE_FIXTURES").expect("ATOMOS_WRITE_FIXTURES"));
    for protocol in PROTOCOLS {
        let work = std::env::temp_dir().join(format!(
            "atomos-fixture-write-{protocol}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&work);
        write_fixture(protocol, &work);
        let out = root.join(protocol);
        let _ = std::fs::remove_dir_all(&out);
        copy_dir(&work.join("node-1"), &out);
        let _ = std::fs::remove_dir_all(&work);
    }
}
