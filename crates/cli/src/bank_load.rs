//! Generated load for node processes: threads moving money between accounts every member
//! shares, and a once-a-second audit of the total, logged, so that a cluster of processes can
//! be checked from its logs ("bank audit ... total=T expected=E").
//!
//! Under `active` the transfers are procedure invocations (registered by every node with
//! [`register`]); under the other protocols, closures.
//!
//! Under a replicated protocol (`certify`, `active`) every transfer also counts itself in a counter of
//! its thread and run (a run is one start of the load on one node), and audits log every
//! run's count from the replicated state (`counted="run:count,..."`) beside the number of
//! transfers this run saw acknowledged (`run=R transfers=N`): a check can then see that
//! nothing acknowledged was lost, whichever process was killed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use atomos::{Node, ProcedureKind, Procedures, Protocol, RegisterError, TRef, Tx, TxError};
use rand::Rng;
use tracing::{info, warn};

/// Accounts of the generated bank, and each one's opening balance.
pub const ACCOUNTS: u64 = 64;
pub const OPENING: i64 = 1_000;
/// The size of a ballast object, and how many one transaction writes.
const BALLAST_OBJECT: usize = 256 << 10;
const BALLAST_PER_TX: u64 = 4;

/// What a node's load does.
pub struct LoadSettings {
    /// Transfer threads.
    pub threads: usize,
    /// This member creates the accounts (and writes the ballast).
    pub creator: bool,
    /// MiB of ballast objects the creator writes before its transfers start.
    pub ballast_mib: u64,
    /// How long a transfer thread pauses between transfers, so that audits get through:
    /// under TFA an audit reads the accounts one round trip after another and aborts when one
    /// it read changes meanwhile (TFA has no multi-version reads), so unpaced transfers
    /// starve it.
    pub pace: Duration,
}
/// A transaction gives up after this long (and is retried), so that stopping never waits on
/// one that keeps conflicting.
const GIVE_UP: Duration = Duration::from_secs(5);

/// The running load; [`BankLoad::stop`] ends it.
pub struct BankLoad {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

fn ballast(i: u64) -> TRef<Vec<u8>> {
    TRef::new(format!("bank-load/ballast/{i}"))
}

/// Writes `mib` MiB of ballast objects (those missing: a restart goes on where it stopped);
/// logs how long it took.
fn write_ballast(node: &Node, stop: &AtomicBool, mib: u64) {
    let started = std::time::Instant::now();
    let objects = (mib << 20).div_ceil(BALLAST_OBJECT as u64);
    let mut first = 0;
    while first < objects && !stop.load(Ordering::Relaxed) {
        let last = (first + BALLAST_PER_TX).min(objects);
        let written = until_done(stop, "writing ballast", || {
            node.tx().timeout(GIVE_UP).run(|tx| {
                for i in first..last {
                    if !tx.exists(&ballast(i))? {
                        tx.create(&ballast(i), vec![i as u8; BALLAST_OBJECT])?;
                    }
                }
                Ok(())
            })
        });
        if written.is_none() {
            return;
        }
        first = last;
    }
    info!(
        mib,
        seconds = started.elapsed().as_secs_f64(),
        "bank load: ballast written"
    );
}

fn accounts() -> Vec<TRef<i64>> {
    (0..ACCOUNTS)
        .map(|i| TRef::new(format!("bank-load/{i}")))
        .collect()
}

/// The runs that count their transfers: (run, threads).
fn runs() -> TRef<Vec<(u64, usize)>> {
    TRef::new("bank-load/runs")
}

/// The transfers thread `thread` of run `run` committed.
fn counter(run: u64, thread: usize) -> TRef<u64> {
    TRef::new(format!("bank-load/count/{run}/{thread}"))
}

/// Every counting run's committed transfers, as `run:count,...`.
fn counted(tx: &mut atomos::Tx<'_>) -> Result<String, TxError> {
    let mut out = Vec::new();
    if tx.exists(&runs())? {
        for &(run, threads) in tx.read(&runs())? {
            let mut n = 0;
            for t in 0..threads {
                n += *tx.read(&counter(run, t))?;
            }
            out.push(format!("{run}:{n}"));
        }
    }
    Ok(out.join(","))
}

/// The transfer procedure's name (under `active` the load's transfers are invocations).
const TRANSFER: &str = "bank-load.transfer";

/// A transfer's arguments: from, to, amount, and the (run, thread) counter to count it in
/// (`None`: not counted).
type TransferArgs = (usize, usize, i64, Option<(u64, usize)>);

/// A remote client's transfer (`bank-load.client-transfer`): from, to, amount, and the
/// client's number, whose transfers are counted apart; it returns that count after it.
pub const CLIENT_TRANSFER: &str = "bank-load.client-transfer";
/// A remote client's committed transfers (`bank-load.client-count`, read-only): the client's
/// number in, the count out.
pub const CLIENT_COUNT: &str = "bank-load.client-count";

/// A client transfer's arguments: from, to, amount, the client's number.
pub type ClientTransferArgs = (usize, usize, i64, u64);

/// The transfers client `client` committed.
fn client_counter(client: u64) -> TRef<u64> {
    TRef::new(format!("bank-load/client/{client}"))
}

/// Moves `amount` between accounts `from` and `to` (indices from anywhere: checked).
fn move_money(tx: &mut Tx<'_>, from: usize, to: usize, amount: i64) -> Result<(), TxError> {
    let accts = accounts();
    let (Some(from), Some(to)) = (accts.get(from), accts.get(to)) else {
        return Err(TxError::abort(format!(
            "accounts are 0 to {}",
            ACCOUNTS - 1
        )));
    };
    tx.modify(from, |b| *b -= amount)?;
    tx.modify(to, |b| *b += amount)
}

/// Moves the amount and counts the transfer: the load's transfer, as a procedure or a closure.
fn transfer(tx: &mut Tx<'_>, &(from, to, amount, count): &TransferArgs) -> Result<(), TxError> {
    move_money(tx, from, to, amount)?;
    if let Some((run, thread)) = count {
        tx.modify(&counter(run, thread), |n| *n += 1)?;
    }
    Ok(())
}

fn client_transfer(
    tx: &mut Tx<'_>,
    &(from, to, amount, client): &ClientTransferArgs,
) -> Result<u64, TxError> {
    move_money(tx, from, to, amount)?;
    let count = client_count(tx, &client)? + 1;
    if count == 1 {
        tx.create(&client_counter(client), count)?;
    } else {
        tx.write(&client_counter(client), count)?;
    }
    Ok(count)
}

fn client_count(tx: &mut Tx<'_>, &client: &u64) -> Result<u64, TxError> {
    let c = client_counter(client);
    Ok(if tx.exists(&c)? { *tx.read(&c)? } else { 0 })
}

/// Registers the load's procedures (every node of a cluster registers the same): the load's
/// transfer, and a transfer and a count for remote clients.
pub fn register(procedures: &Procedures) -> Result<(), RegisterError> {
    procedures.register(TRANSFER, ProcedureKind::Update, transfer)?;
    procedures.register(CLIENT_TRANSFER, ProcedureKind::Update, client_transfer)?;
    procedures.register(CLIENT_COUNT, ProcedureKind::ReadOnly, client_count)
}

/// Runs the transaction until it commits or the load stops; failures (an unreachable peer,
/// the accounts not created yet) are logged and retried, except a commit whose outcome is
/// unknown: it may have happened, so it is logged and not run again.
fn until_done<R>(
    stop: &AtomicBool,
    what: &str,
    mut f: impl FnMut() -> Result<R, TxError>,
) -> Option<R> {
    let mut warned = false;
    while !stop.load(Ordering::Relaxed) {
        match f() {
            Ok(r) => return Some(r),
            Err(e @ TxError::OutcomeUnknown { .. }) => {
                warn!(error = %e, "bank load: {what} has an unknown outcome; not retried");
                return None;
            }
            Err(e) => {
                if !warned {
                    warn!(error = %e, "bank load: {what} failed; retrying");
                    warned = true;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    None
}

impl BankLoad {
    /// Starts the transfer threads and the auditor on `node`; the member `creator` creates
    /// the accounts, then writes the ballast.
    pub fn start(node: Node, settings: LoadSettings) -> BankLoad {
        let LoadSettings {
            threads,
            creator,
            ballast_mib,
            pace,
        } = settings;
        let stop = Arc::new(AtomicBool::new(false));
        let transfers = Arc::new(AtomicU64::new(0));
        let counting = node.protocol().is_replicated();
        let run = rand::random::<u64>() >> 1;
        // Transfer threads wait until the accounts exist and the run is registered.
        let ready = Arc::new(AtomicBool::new(!counting));
        let mut handles = Vec::new();
        {
            let (node, stop, transfers, ready) =
                (node.clone(), stop.clone(), transfers.clone(), ready.clone());
            handles.push(std::thread::spawn(move || {
                let accts = accounts();
                if creator {
                    let created = until_done(&stop, "creating the accounts", || {
                        node.tx().timeout(GIVE_UP).run(|tx| {
                            for a in &accts {
                                if !tx.exists(a)? {
                                    tx.create(a, OPENING)?;
                                }
                            }
                            if counting && !tx.exists(&runs())? {
                                tx.create(&runs(), Vec::new())?;
                            }
                            Ok(())
                        })
                    });
                    if created.is_some() {
                        info!(accounts = ACCOUNTS, "bank load: accounts created");
                    }
                    if ballast_mib > 0 {
                        write_ballast(&node, &stop, ballast_mib);
                    }
                }
                if counting {
                    let registered = until_done(&stop, "registering the run", || {
                        node.tx().timeout(GIVE_UP).run(|tx| {
                            tx.modify(&runs(), |r| r.push((run, threads)))?;
                            for t in 0..threads {
                                tx.create(&counter(run, t), 0)?;
                            }
                            Ok(())
                        })
                    });
                    if registered.is_some() {
                        info!(run, "bank load: run registered");
                        ready.store(true, Ordering::Release);
                    }
                }
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_secs(1));
                    // Read before the snapshot: every transfer acknowledged by now is in it
                    // (a commit returns once this replica applied it).
                    let acknowledged = transfers.load(Ordering::Relaxed);
                    let audit = node.tx().read_only().timeout(GIVE_UP).run(|tx| {
                        let mut sum = 0;
                        for a in &accts {
                            sum += *tx.read(a)?;
                        }
                        let counts = if counting {
                            counted(tx)?
                        } else {
                            String::new()
                        };
                        Ok((sum, counts))
                    });
                    match audit {
                        Ok((total, counts)) => info!(
                            total,
                            expected = OPENING * ACCOUNTS as i64,
                            run,
                            transfers = acknowledged,
                            counted = %counts,
                            "bank audit"
                        ),
                        Err(e) => warn!(error = %e, "bank audit failed"),
                    }
                }
            }));
        }
        for thread in 0..threads {
            let (node, stop, transfers, ready) =
                (node.clone(), stop.clone(), transfers.clone(), ready.clone());
            handles.push(std::thread::spawn(move || {
                let mut rng = rand::rng();
                while !ready.load(Ordering::Acquire) {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                while !stop.load(Ordering::Relaxed) {
                    let from = rng.random_range(0..ACCOUNTS) as usize;
                    let to = (from + rng.random_range(1..ACCOUNTS) as usize) % ACCOUNTS as usize;
                    let amount = rng.random_range(1..=10);
                    let args: TransferArgs = (from, to, amount, counting.then_some((run, thread)));
                    let done = until_done(&stop, "a transfer", || {
                        if node.protocol() == Protocol::Active {
                            node.invoke::<TransferArgs, ()>(TRANSFER, &args)
                        } else {
                            node.tx().timeout(GIVE_UP).run(|tx| transfer(tx, &args))
                        }
                    });
                    if done.is_some() {
                        transfers.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(pace);
                }
            }));
        }
        BankLoad {
            stop,
            threads: handles,
        }
    }

    /// Stops the load and waits for its threads.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
    }
}
