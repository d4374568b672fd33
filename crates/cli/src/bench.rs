//! `atomos bench`: its flags, their checks, and the runs they describe (one workload, a sweep
//! of them, or a member of a run with a process per node).

use std::path::PathBuf;
use std::time::Duration;

use atomos::protocols::oss::CommitMode;
use atomos::{ContentionPolicy, Protocol};
use atomos_bench::{BenchConfig, WorkloadKind};
use clap::ValueEnum;

use super::{seconds, write_json};
use crate::sweep::{self, Sweep};

/// What a transaction does when it meets a conflict (`--contention`).
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Contention {
    AbortSelf,
    Backoff,
    Priority,
}

impl From<Contention> for ContentionPolicy {
    fn from(c: Contention) -> Self {
        match c {
            Contention::AbortSelf => ContentionPolicy::AbortSelf,
            Contention::Backoff => ContentionPolicy::Backoff,
            Contention::Priority => ContentionPolicy::Priority,
        }
    }
}

#[derive(Clone, clap::Args)]
#[command(allow_negative_numbers = true)]
pub(crate) struct BenchArgs {
    /// bank, linkedlist, skiplist, bst, rbtree, hashtable, loan, vacation, tpcc, shared-counter,
    /// private-counters (OSS's micro-benchmarks), wordcount (OSS's MapReduce example: --objects
    /// distinct words); footprint (memory of
    /// --objects objects); net (round trips and one-way throughput between two nodes on
    /// loopback); order (the order layer's throughput and latency); or executor (the
    /// speculative serial executor alone: bank transfers as procedures over --objects
    /// accounts, windows of --batch invocations, --threads threads running read-only
    /// procedures of --balance-k accounts beside it).
    workload: String,
    /// Consistency protocol.
    #[arg(long, default_value = "local", value_parser = crate::PROTOCOLS)]
    protocol: String,
    /// Nodes in the benchmarked cluster (default: 1; 3 for order).
    #[arg(long)]
    nodes: Option<usize>,
    /// How the benchmarked nodes are linked: memory or tcp (loopback).
    #[arg(long, default_value = "memory", value_parser = ["memory", "tcp"])]
    transport: String,
    /// Worker threads (per node).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Accounts (bank, loan), initial set size (sets; key range is twice that), customers
    /// (vacation; three times as many cars, flights and rooms), distinct words (wordcount) or
    /// objects (footprint).
    /// Default: the workload's own (HyflowCPP thesis 6.2).
    #[arg(long)]
    objects: Option<usize>,
    /// Fraction of read-only operations (vacation: of reservations; tpcc: see --mix).
    #[arg(long, default_value_t = 0.5)]
    read_ratio: f64,
    /// Vacation: resources a reservation or an offer update touches.
    #[arg(long, default_value_t = 10)]
    queries: usize,
    /// TPC-C: warehouses (default: one per node).
    #[arg(long)]
    warehouses: Option<usize>,
    /// TPC-C: transaction mix: standard (45/43/4/4/4) or read-heavy (order-status and
    /// stock-level 45% each, the others 3.3%).
    #[arg(long, default_value = "standard", value_parser = ["standard", "read-heavy"])]
    mix: String,
    /// TPC-C: population per warehouse: small (10,000 items, 300 customers per district) or
    /// full (the specification's 100,000 and 3,000).
    #[arg(long, default_value = "small", value_parser = ["small", "full"])]
    scale: String,
    /// Bank: a balance reads this many random accounts instead of all.
    #[arg(long)]
    balance_k: Option<usize>,
    /// Bank and hash table: how an update's inner operations are composed: flat, closed,
    /// checkpoint or open (thesis 6.3-6.4).
    #[arg(long, default_value = "flat", value_parser = ["flat", "closed", "checkpoint", "open"])]
    nesting: String,
    /// Bank and hash table: inner operations (transfers, adds/removes) per update.
    #[arg(long, default_value_t = 1)]
    inner: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Contention manager.
    #[arg(long, value_enum, default_value = "backoff")]
    contention: Contention,
    /// Seed of the workers' random generators.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also write the report to this file as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Run once per value: PARAM=V1,V2,... (threads, nodes, read-ratio, objects, inner,
    /// queries, warehouses, balance-k, protocol, transport, nesting, mix, scale, contention, oss-commit,
    /// link-delay-ms, linked, sched, arrival-rate, cmax, answer-poll-us, busy-poll-us,
    /// runtime-threads).
    /// Repeat it to run every combination. Each run's JSON goes next to --json's path with the
    /// settings in its name (bank.json -> bank-threads-2.json).
    #[arg(long)]
    sweep: Vec<Sweep>,
    /// No progress line.
    #[arg(long)]
    quiet: bool,
    /// Delay every link of the benchmarked cluster by this many milliseconds (one node has
    /// none).
    #[arg(long, default_value_t = 0.0)]
    link_delay_ms: f64,
    /// Net: payload bytes per message.
    #[arg(long, default_value_t = 64)]
    message_bytes: usize,
    /// Order: payload bytes per request.
    #[arg(long, default_value_t = 64)]
    request_size: usize,
    /// Order and certify: when the write-ahead logs are fsynced: batch, never, or a period
    /// like 10ms.
    #[arg(long, default_value = "never")]
    fsync: String,
    /// Order: stop the leader every this many seconds (it restarts from its log 0.5 s later).
    #[arg(long)]
    kill_leader_every: Option<f64>,
    /// Order: closed-loop clients per replica.
    #[arg(long, default_value_t = 256)]
    clients: usize,
    /// Order: retire each client after this many requests, so that later ones come from new
    /// clients (0: never).
    #[arg(long, default_value_t = 0)]
    client_requests: u64,
    /// Order: every this many seconds, sample resident memory, log and snapshot sizes and the
    /// replicas' bookkeeping, and report whether each levels off.
    #[arg(long)]
    sample_every: Option<f64>,
    /// Oss: how commits are numbered: ultra-peer, distributed-token or coordinator-token.
    #[arg(long, default_value = "ultra-peer", value_parser = crate::OSS_COMMIT_MODES)]
    oss_commit: String,
    /// Tfa: microseconds an application thread waiting for the protocol's answer polls
    /// for it before it sleeps, 0 to 1000000 (default: the node default, 500).
    #[arg(long)]
    answer_poll_us: Option<u64>,
    /// Over TCP: microseconds each node's transport keeps a runtime worker awake after network
    /// activity, 0 to 1000000 (default: the node default, 100; the node setting busy_poll_us).
    #[arg(long)]
    busy_poll_us: Option<u64>,
    /// Counters: milliseconds each transaction works (sleeps) after its increment (default
    /// 50, as in OSS's experiments).
    #[arg(long)]
    work_ms: Option<f64>,
    /// Milliseconds each worker pauses between two operations (default: 10 for the counters,
    /// as in OSS's experiments; 0 otherwise).
    #[arg(long)]
    pause_ms: Option<f64>,
    /// Run each worker's operations as linked transactions with this many commits
    /// outstanding (counters; 0: off).
    #[arg(long, default_value_t = 0)]
    linked: usize,
    /// Order: requests per batch at most. Executor: invocations speculated before the first
    /// of them is finalized.
    #[arg(long, default_value_t = 256)]
    batch: usize,
    /// Open loop (tpcc): requests arrive as a Poisson process at this many per second and
    /// run on each node's transaction service with --threads workers, each at its profile's
    /// priority; the report gives turnaround_us, execution_us, running_us and reaction_us per
    /// priority.
    #[arg(long)]
    arrival_rate: Option<f64>,
    /// Open loop: the transaction service's policy: none (run to completion), preemptive,
    /// cmax (see --cmax) or lazy (cmax, and one level up per preemption).
    #[arg(long, default_value = "none", value_parser = ["none", "preemptive", "cmax", "lazy"])]
    sched: String,
    /// Open loop, --sched cmax or lazy: a transaction preempted this many times moves to the
    /// highest level (not preempted again).
    #[arg(long, default_value_t = atomos::service::DEFAULT_CMAX)]
    cmax: u32,
    /// Open loop: transactions started and not ended at once, per node (the context pool).
    #[arg(long, default_value_t = 64)]
    contexts: usize,
    /// Run each node in a process of its own (this program, started once per node), linked
    /// over loopback TCP (give --transport tcp; not with --sweep or --arrival-rate).
    #[arg(long)]
    processes: bool,
    /// Distributed protocols: run each node's --threads workers as fibers on the nodes' network
    /// runtime, whose threads (--runtime-threads) also read the sockets, instead of as threads
    /// of their own that wait for the protocol's answers.
    #[arg(long)]
    fibers: bool,
    /// Worker threads of the runtime each process runs its nodes' networking (and --fibers
    /// workers) on, 1 to 64 (default 2).
    #[arg(long, default_value_t = atomos_bench::DEFAULT_RUNTIME_THREADS)]
    runtime_threads: usize,
    /// Member N of a --processes run (started by that run, not by hand).
    #[arg(long, hide = true)]
    member: Option<usize>,
}

impl BenchArgs {
    /// Whether this run writes to member processes' pipes (it starts them, or is one).
    pub(crate) fn talks_to_members(&self) -> bool {
        self.processes || self.member.is_some()
    }
}

/// Runs the benchmark the arguments describe; `Ok(false)` when its invariant failed.
pub(crate) fn run(args: BenchArgs) -> Result<bool, String> {
    let own_cluster = ["footprint", "net", "executor", "order"];
    if (args.processes || args.member.is_some()) && own_cluster.contains(&args.workload.as_str()) {
        return Err(format!(
            "--processes runs workloads on a cluster; bench {} has a setup of its own",
            args.workload
        ));
    }
    if args.workload == "footprint" {
        let objects = args.objects.unwrap_or(1_000_000);
        let report = atomos_bench::footprint::run(objects).map_err(|e| e.to_string())?;
        println!(
            "footprint: {} objects of {} bytes: resident {:.1} MiB -> {:.1} MiB ({:.0} bytes per object), created in {:.2} s; read-back {}",
            report.objects,
            report.value_bytes,
            report.rss_before_mb,
            report.rss_after_mb,
            report.bytes_per_object,
            report.create_s,
            if report.invariant_ok { "OK" } else { "FAILED" }
        );
        write_json(&args.json, &report)?;
        return Ok(report.invariant_ok);
    }
    let is_transactional = args.workload.parse::<WorkloadKind>().is_ok();
    if !args.sweep.is_empty() && !is_transactional {
        return Err(format!(
            "--sweep runs the transactional workloads, not {}",
            args.workload
        ));
    }
    if !is_transactional && args.runtime_threads != atomos_bench::DEFAULT_RUNTIME_THREADS {
        return Err(format!(
            "--runtime-threads sets the runtime of the transactional workloads' nodes, not {}'s",
            args.workload
        ));
    }
    let link_delay = link_delay(args.link_delay_ms)?;
    if args.workload == "net" {
        let report = atomos_bench::net::run(&atomos_bench::net::NetBenchConfig {
            duration: seconds(args.duration, "--duration")?,
            message_bytes: args.message_bytes,
            link_delay,
        })?;
        println!("{}", report.summary());
        write_json(&args.json, &report)?;
        return Ok(true);
    }
    if args.workload == "executor" {
        let report = atomos_bench::executor::run(&atomos_bench::executor::ExecutorBenchConfig {
            accounts: args.objects.unwrap_or(10_000) as u64,
            duration: seconds(args.duration, "--duration")?,
            readers: args.threads,
            balance_k: args.balance_k.unwrap_or(10),
            window: args.batch,
        })?;
        println!("{}", report.summary());
        write_json(&args.json, &report)?;
        return Ok(report.invariant_ok);
    }
    if args.workload == "order" {
        let nodes = args.nodes.unwrap_or(3);
        let report = atomos_bench::order::run(&atomos_bench::order::OrderBenchConfig {
            nodes,
            request_bytes: args.request_size,
            duration: seconds(args.duration, "--duration")?,
            fsync: args.fsync.parse().map_err(|e| format!("--fsync: {e}"))?,
            kill_leader_every: args
                .kill_leader_every
                .map(|s| seconds(s, "--kill-leader-every"))
                .transpose()?,
            clients_per_node: args.clients,
            batch_max: args.batch.max(1),
            link_delay,
            client_requests: args.client_requests,
            sample_every: args
                .sample_every
                .map(|s| seconds(s, "--sample-every"))
                .transpose()?,
            machine: match args.protocol.as_str() {
                "local" => atomos_bench::order::OrderMachine::Register,
                "active" => atomos_bench::order::OrderMachine::Active {
                    accounts: args.objects.unwrap_or(10_000) as u64,
                },
                other => {
                    return Err(format!(
                        "--protocol {other}: the order benchmark runs the register (local, the \
                         default) or the active store (active)"
                    ))
                }
            },
        })?;
        println!("{}", report.summary());
        write_json(&args.json, &report)?;
        return Ok(true);
    }
    if let Some(index) = args.member {
        let cfg = bench_config(&args)?;
        let (mut input, mut out) = (std::io::stdin().lock(), std::io::stdout().lock());
        atomos_bench::processes::serve(&cfg, index, &mut input, &mut out)
            .map_err(|e| e.to_string())?;
        return Ok(true);
    }
    if !args.sweep.is_empty() {
        if args.processes {
            return Err(
                "--processes and --sweep do not go together: run each point as a command".into(),
            );
        }
        return bench_sweep(args);
    }
    let report = bench_workload(&args)?;
    println!("{}", report.summary());
    write_json(&args.json, &report)?;
    Ok(report.invariant_ok)
}

/// Runs every point of the sweep's grid and writes each result to its own file.
fn bench_sweep(args: BenchArgs) -> Result<bool, String> {
    let json = args
        .json
        .clone()
        .ok_or("--sweep writes one JSON file per point: give --json PATH (points go next to it)")?;
    let points = sweep::grid(&args.sweep);
    // Every point's settings are checked before the first one runs.
    let mut runs = Vec::with_capacity(points.len());
    for point in &points {
        let mut run = args.clone();
        for (param, value) in point {
            set_swept(&mut run, param, value)?;
        }
        let settings: Vec<String> = point.iter().map(|(p, v)| format!("{p}={v}")).collect();
        bench_config(&run).map_err(|e| format!("--sweep {}: {e}", settings.join(" ")))?;
        runs.push(run);
    }
    let mut all_ok = true;
    for (i, (point, run)) in points.iter().zip(runs).enumerate() {
        let settings: Vec<String> = point.iter().map(|(p, v)| format!("{p}={v}")).collect();
        println!("[{}/{}] {}", i + 1, points.len(), settings.join(" "));
        let report = bench_workload(&run)?;
        println!("{}", report.summary());
        let path = sweep::point_path(&json, point);
        write_json(&Some(path.clone()), &report)?;
        println!("  -> {}", path.display());
        all_ok &= report.invariant_ok;
    }
    Ok(all_ok)
}

/// Sets one swept flag on the arguments.
fn set_swept(args: &mut BenchArgs, param: &str, value: &str) -> Result<(), String> {
    fn num<T: std::str::FromStr>(param: &str, value: &str) -> Result<T, String> {
        value
            .parse()
            .map_err(|_| format!("--sweep {param}: {value:?} is not a valid value"))
    }
    match param {
        "threads" => args.threads = num(param, value)?,
        "nodes" => args.nodes = Some(num(param, value)?),
        "read-ratio" => args.read_ratio = num(param, value)?,
        "objects" => args.objects = Some(num(param, value)?),
        "inner" => args.inner = num(param, value)?,
        "queries" => args.queries = num(param, value)?,
        "warehouses" => args.warehouses = Some(num(param, value)?),
        "balance-k" => args.balance_k = Some(num(param, value)?),
        "protocol" => args.protocol = value.to_string(),
        "transport" => args.transport = value.to_string(),
        "nesting" => args.nesting = value.to_string(),
        "mix" => args.mix = value.to_string(),
        "scale" => args.scale = value.to_string(),
        "oss-commit" => args.oss_commit = value.to_string(),
        "link-delay-ms" => args.link_delay_ms = num(param, value)?,
        "linked" => args.linked = num(param, value)?,
        "sched" => args.sched = value.to_string(),
        "arrival-rate" => args.arrival_rate = Some(num(param, value)?),
        "cmax" => args.cmax = num(param, value)?,
        "answer-poll-us" => args.answer_poll_us = Some(num(param, value)?),
        "busy-poll-us" => args.busy_poll_us = Some(num(param, value)?),
        "runtime-threads" => args.runtime_threads = num(param, value)?,
        "contention" => {
            args.contention =
                Contention::from_str(value, true).map_err(|e| format!("--sweep contention: {e}"))?
        }
        other => return Err(format!("--sweep cannot vary {other:?}")),
    }
    Ok(())
}

/// Runs one transactional workload as the arguments say.
fn bench_workload(args: &BenchArgs) -> Result<atomos_bench::BenchReport, String> {
    let cfg = bench_config(args)?;
    if cfg.processes {
        let program = std::env::current_exe()
            .map_err(|e| format!("--processes: cannot find this program: {e}"))?;
        // Every argument after the program's name: the members run the same benchmark.
        let own: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
        return atomos_bench::processes::run(&cfg, &program, &own).map_err(|e| e.to_string());
    }
    atomos_bench::run(&cfg).map_err(|e| e.to_string())
}

/// The benchmark the arguments describe.
fn bench_config(args: &BenchArgs) -> Result<BenchConfig, String> {
    let link_delay = link_delay(args.link_delay_ms)?;
    let workload: WorkloadKind = args.workload.parse()?;
    if workload == WorkloadKind::Tpcc && args.objects.is_some() {
        return Err("tpcc is sized by --warehouses and --scale, not --objects".into());
    }
    if !workload.sized_by_objects() && args.objects.is_some() {
        return Err(format!(
            "{workload} has one counter per worker or one for all, not --objects"
        ));
    }
    if workload != WorkloadKind::Tpcc && args.warehouses.is_some() {
        return Err(format!(
            "--warehouses is a tpcc setting; {workload} has none"
        ));
    }
    let nodes = args.nodes.unwrap_or(1);
    // One node has no links to delay: a sweep over nodes may start at one.
    let protocol: Protocol = args.protocol.parse()?;
    let oss_commit = CommitMode::parse(&args.oss_commit).ok_or_else(|| {
        let names: Vec<&str> = CommitMode::NAMES.iter().map(|(n, _)| *n).collect();
        format!(
            "--oss-commit {:?} is not a commit mode ({})",
            args.oss_commit,
            names.join(", ")
        )
    })?;
    let counters = matches!(
        workload,
        WorkloadKind::SharedCounter | WorkloadKind::PrivateCounters
    );
    if !counters && args.work_ms.is_some() {
        return Err(format!(
            "--work-ms is a counters setting; {workload} has none"
        ));
    }
    let millis = |value: Option<f64>, default: f64, flag: &str| -> Result<Duration, String> {
        let ms = value.unwrap_or(default);
        if ms.is_finite() && (0.0..=60_000.0).contains(&ms) {
            Ok(Duration::from_secs_f64(ms / 1000.0))
        } else {
            Err(format!(
                "{flag} must be a number of milliseconds from 0 to 60000, not {ms}"
            ))
        }
    };
    let work = millis(args.work_ms, if counters { 50.0 } else { 0.0 }, "--work-ms")?;
    let pause = millis(
        args.pause_ms,
        if counters { 10.0 } else { 0.0 },
        "--pause-ms",
    )?;
    let sched = atomos::service::Policy::parse(&args.sched, args.cmax)
        .map_err(|e| format!("--sched: {e}"))?;
    if args.arrival_rate.is_none() && sched != atomos::service::Policy::None {
        return Err("--sched needs an open-loop run (--arrival-rate)".into());
    }
    if sched.cmax() == Some(0) {
        return Err("--cmax must be at least 1".into());
    }
    let micros = |value: Option<u64>, default: Duration, flag: &str| match value {
        None => Ok(default),
        Some(us) if us <= 1_000_000 => Ok(Duration::from_micros(us)),
        Some(us) => Err(format!(
            "{flag} must be a number of microseconds from 0 to 1000000, not {us}"
        )),
    };
    let answer_poll = micros(
        args.answer_poll_us,
        atomos::runtime::DEFAULT_ANSWER_POLL,
        "--answer-poll-us",
    )?;
    let busy_poll = micros(
        args.busy_poll_us,
        atomos::net::tcp::DEFAULT_BUSY_POLL,
        "--busy-poll-us",
    )?;
    let cfg = BenchConfig {
        workload,
        protocol,
        nodes,
        transport: args.transport.parse()?,
        link_delay,
        threads: args.threads,
        objects: args.objects.unwrap_or(workload.default_objects()),
        read_ratio: args.read_ratio,
        balance_k: args.balance_k,
        nesting: args.nesting.parse()?,
        inner: args.inner.max(1),
        queries: args.queries,
        warehouses: args.warehouses,
        mix: args.mix.parse()?,
        scale: args.scale.parse()?,
        duration: seconds(args.duration, "--duration")?,
        contention: args.contention.into(),
        seed: args.seed,
        progress: !args.quiet,
        fsync: args.fsync.parse().map_err(|e| format!("--fsync: {e}"))?,
        oss_commit,
        answer_poll,
        busy_poll,
        work,
        pause,
        linked: args.linked,
        arrival_rate: args.arrival_rate,
        sched,
        contexts: args.contexts,
        processes: args.processes,
        fibers: args.fibers,
        runtime_threads: args.runtime_threads,
    };
    Ok(cfg)
}

fn link_delay(ms: f64) -> Result<Duration, String> {
    if ms.is_finite() && (0.0..=60_000.0).contains(&ms) {
        Duration::try_from_secs_f64(ms / 1000.0).map_err(|e| format!("--link-delay-ms: {e}"))
    } else {
        Err(format!(
            "--link-delay-ms must be a number of milliseconds from 0 to 60000, not {ms}"
        ))
    }
}
