//! `atomos bench --processes`: every node of the benchmarked cluster in a process of its own,
//! linked over loopback TCP, as a deployment runs them (no shared runtime, no shared cores'
//! worth of threads in one address space). The parent starts this program once per node with
//! its own arguments and `--member N`, tells each member where the others listen, has the
//! first run the workload's setup, starts every member's workers together, gathers what each
//! measured, and has the invariant checked (on the first node; under a replicated protocol,
//! on every replica). The report is the one a single-process run gives, its `processes` set.

mod member;
mod wire;

use std::ffi::OsString;
use std::io::{BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

pub use member::serve;
use wire::{receive, send, FromMember, ToMember};

use crate::harness::{report, workload_for, BenchConfig, BenchError, BenchReport, Measured, Tally};
use crate::workloads::Check;
use crate::TransportKind;
use atomos::{Protocol, Stats};

/// One member process and its pipes. Dropping it kills the process if it still runs.
struct MemberProcess {
    index: usize,
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl MemberProcess {
    fn tell(&mut self, msg: &ToMember) -> Result<(), BenchError> {
        send(&mut self.input, msg)
            .map_err(|e| BenchError::Config(format!("member {}: {e}", self.index)))
    }

    /// The member's next message; its failure is an error naming it.
    fn hear(&mut self) -> Result<FromMember, BenchError> {
        match receive(&mut self.output) {
            Ok(FromMember::Failed(e)) => {
                Err(BenchError::Config(format!("member {}: {e}", self.index)))
            }
            Ok(msg) => Ok(msg),
            Err(e) => Err(BenchError::Config(format!("member {}: {e}", self.index))),
        }
    }

    /// The member's next message, which must be `what` (`take` gives its content).
    fn expect<T>(
        &mut self,
        what: &str,
        take: impl FnOnce(FromMember) -> Result<T, FromMember>,
    ) -> Result<T, BenchError> {
        let index = self.index;
        take(self.hear()?).map_err(|msg| {
            BenchError::Config(format!("member {index}: expected {what}, got {msg:?}"))
        })
    }
}

impl Drop for MemberProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Whether `cfg` can run with a process per node.
fn check_config(cfg: &BenchConfig) -> Result<(), BenchError> {
    let bad = |m: &str| Err(BenchError::Config(m.to_string()));
    if cfg.protocol == Protocol::Local {
        return bad("--processes: protocol local runs on one node, in this process");
    }
    if cfg.transport != TransportKind::Tcp {
        return bad("--processes links the nodes over TCP: give --transport tcp");
    }
    if cfg.arrival_rate.is_some() {
        return bad("--processes runs closed loops only, not --arrival-rate");
    }
    if !cfg.workload.checks_the_store_alone() {
        return Err(BenchError::Config(format!(
            "--processes: {}'s invariant is checked against counts its workers keep in their \
             process; it runs in one process (bank, loan, vacation and tpcc run in several)",
            cfg.workload
        )));
    }
    Ok(())
}

/// Runs `cfg` with each node in a process of its own: `program` started with `args` (this
/// program's own benchmark arguments) and `--member N`.
pub fn run(
    cfg: &BenchConfig,
    program: &Path,
    args: &[OsString],
) -> Result<BenchReport, BenchError> {
    cfg.validate()?;
    check_config(cfg)?;
    let mut members = Vec::new();
    for index in 0..cfg.nodes {
        let mut child = Command::new(program)
            .args(args)
            .args(["--member", &index.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| BenchError::Config(format!("cannot start {}: {e}", program.display())))?;
        let (Some(input), Some(output)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(BenchError::Config("a member has no pipes".into()));
        };
        members.push(MemberProcess {
            index,
            child,
            input,
            output: BufReader::new(output),
        });
    }
    let mut addrs = Vec::new();
    for m in &mut members {
        let port = m.expect("its port", |msg| match msg {
            FromMember::Listening(port) => Ok(port),
            other => Err(other),
        })?;
        let id = m.index as u64 + 1;
        addrs.push((id, SocketAddr::from((Ipv4Addr::LOCALHOST, port))));
    }
    for m in &mut members {
        m.tell(&ToMember::Members(addrs.clone()))?;
    }
    for m in &mut members {
        m.expect("ready", |msg| match msg {
            FromMember::Ready => Ok(()),
            other => Err(other),
        })?;
    }
    members[0].tell(&ToMember::Setup)?;
    members[0].expect("the setup", |msg| match msg {
        FromMember::SetUp => Ok(()),
        other => Err(other),
    })?;
    if cfg.progress {
        eprintln!(
            "  {} member processes running for {:?}",
            cfg.nodes, cfg.duration
        );
    }
    for m in &mut members {
        m.tell(&ToMember::Run)?;
    }
    let mut per_kind: Vec<Tally> = Vec::new();
    let (mut elapsed, mut stats) = (0f64, Stats::default());
    for m in &mut members {
        let run = m.expect("its measurements", |msg| match msg {
            FromMember::Ran(run) => Ok(run),
            other => Err(other),
        })?;
        elapsed = elapsed.max(run.elapsed_s);
        stats = stats.plus(&run.stats);
        for (i, (ops, samples)) in run.tallies.iter().enumerate() {
            let tally = Tally::decode(*ops, samples)
                .map_err(|e| BenchError::Config(format!("member {}: {e}", m.index)))?;
            match per_kind.get_mut(i) {
                Some(sum) => sum.add(&tally),
                None => per_kind.push(tally),
            }
        }
    }
    let checkers = if cfg.protocol.is_replicated() {
        members.len()
    } else {
        1
    };
    let mut check = Check {
        ok: true,
        detail: String::new(),
    };
    let mut details = Vec::new();
    for m in members.iter_mut().take(checkers) {
        m.tell(&ToMember::Check)?;
        let (ok, detail) = m.expect("its check", |msg| match msg {
            FromMember::Checked(ok, detail) => Ok((ok, detail)),
            other => Err(other),
        })?;
        check.ok &= ok;
        details.push(if checkers > 1 && !ok {
            format!("replica {}: {detail}", m.index + 1)
        } else {
            detail
        });
    }
    details.dedup();
    check.detail = details.join("; ");
    for m in &mut members {
        m.tell(&ToMember::Exit)?;
    }
    for mut m in members {
        let _ = m.input.flush();
        let _ = m.child.wait();
    }
    let profiles = workload_for(cfg, cfg.threads * cfg.nodes, cfg.nodes)?.profiles();
    Ok(report(
        cfg,
        Measured {
            nodes: cfg.nodes,
            profiles,
            per_kind,
            elapsed,
            stats,
            check,
            hot_spots: Vec::new(),
            sched: None,
            // The nodes ran in their own processes.
            tfa: None,
        },
    ))
}
