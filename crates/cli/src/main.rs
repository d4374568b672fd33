//! The `atomos` command.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

mod backup;
mod bank_load;
mod bench;
mod cluster_up;
mod demo;
mod member;
mod serve;
mod status;
mod sweep;

use bench::BenchArgs;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// atomos: a distributed transactional memory.
#[derive(Parser)]
#[command(name = "atomos", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs a bank on three replicas in this process with a live progress line, kills the
    /// leader a third of the way in and brings it back two thirds in, and checks that every
    /// replica ends with the same balances and the money they started with
    /// (`--protocol local`: one embedded node).
    #[command(allow_negative_numbers = true)]
    Demo {
        /// Seconds to run.
        #[arg(long, default_value_t = 9.0)]
        duration: f64,
        /// Threads moving money (spread over the replicas).
        #[arg(long, default_value_t = 6)]
        threads: usize,
        /// The protocol.
        #[arg(long, default_value = "certify", value_parser = PROTOCOLS)]
        protocol: String,
    },
    /// Runs a benchmark workload and reports throughput, abort rate, latency and its invariant.
    #[command(allow_negative_numbers = true)]
    Bench(Box<BenchArgs>),
    /// Draws benchmark results (files written by `bench --json`) as SVG and PNG figures:
    /// throughput and abort rate against the setting that varies, one line per protocol or
    /// other setting, and latency per kind of operation.
    #[command(allow_negative_numbers = true)]
    Report {
        /// Result files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Where the figures go (created if missing).
        #[arg(long, default_value = "report")]
        out: PathBuf,
    },
    /// Runs a node: listens, connects to its peers, serves until SIGTERM or Ctrl-C.
    #[command(allow_negative_numbers = true)]
    Node {
        /// The TOML file (every key can also be set by an ATOMOS_... environment variable).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Makes a key pair for a member or a client and writes it to a file readable by its owner
    /// only; prints the public key and the lines that admit it.
    #[command(allow_negative_numbers = true)]
    Keygen {
        /// The key file to write.
        #[arg(long)]
        out: PathBuf,
        /// Replace the file if it exists.
        #[arg(long)]
        force: bool,
        /// The key is member ID's: print its `[[peers]]` entry.
        #[arg(long, value_name = "ID", conflicts_with = "client")]
        member: Option<u64>,
        /// The key is a client's, known by NAME: print its `[[clients]]` entry.
        #[arg(long, value_name = "NAME")]
        client: Option<String>,
    },
    /// Manages a cluster of node processes on this machine.
    #[command(subcommand)]
    #[command(allow_negative_numbers = true)]
    Cluster(ClusterCommand),
    /// Reads a node configuration (file and ATOMOS_... environment variables), validates it and
    /// prints the settings a node would run with (the secret hidden), or what is wrong.
    #[command(allow_negative_numbers = true)]
    CheckConfig {
        /// The TOML file (optional: defaults and the environment apply without one).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Asks every member of a cluster where it stands: role, term, committed and applied
    /// positions, lag, health and readiness; then whether the cluster can commit (a majority
    /// follows one leader). Exits 0 when it can and every member answered, 1 otherwise.
    #[command(allow_negative_numbers = true)]
    Status {
        /// The client configuration (`client.toml`, as `cluster up` writes it).
        #[arg(long, value_name = "FILE")]
        client: PathBuf,
        /// Seconds to wait for each member's answer (up to 3600).
        #[arg(long, default_value_t = 3.0)]
        wait: f64,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Takes a backup of a live certify or active cluster through one of its members (every
    /// transaction acknowledged before it is in it), or checks one (`--verify`).
    #[command(allow_negative_numbers = true)]
    Backup {
        /// The client configuration (`client.toml`, as `cluster up` writes it).
        #[arg(long, value_name = "FILE", required_unless_present = "verify")]
        client: Option<PathBuf>,
        /// Where the backup goes (a new file).
        #[arg(long, value_name = "FILE", required_unless_present = "verify")]
        out: Option<PathBuf>,
        /// Seconds to wait for a member to take it (up to 3600).
        #[arg(long, default_value_t = 60.0)]
        wait: f64,
        /// Check the backup FILE instead (its checksums, and that its parts decode).
        #[arg(long, value_name = "FILE", conflicts_with_all = ["client", "out"])]
        verify: Option<PathBuf>,
    },
    /// Seeds the data directory of one member of a new cluster from a backup: run it for each
    /// member's directory, with the same --members, then start the members.
    #[command(allow_negative_numbers = true)]
    Restore {
        /// The backup.
        file: PathBuf,
        /// The member's data directory (its `data_dir`; it must hold no log yet).
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
        /// The new cluster's member ids, comma-separated (its founders).
        #[arg(long, value_name = "IDS")]
        members: String,
    },
    /// Prints the configuration reference in Markdown: every key, its ATOMOS_ variable, type,
    /// default, which nodes read it and what it means (docs/guide/configuration.md).
    ConfigReference,
    /// Lists or changes the members of a certify or active cluster (changes need a client
    /// the members list in `operators`).
    #[command(subcommand)]
    Member(member::MemberCommand),
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Starts N node processes on loopback with a generated secret and configuration, prints
    /// how to reach them, and stops them all on Ctrl-C (or SIGTERM).
    #[command(allow_negative_numbers = true)]
    Up {
        /// Number of nodes.
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Consistency protocol.
        #[arg(long, default_value = "local", value_parser = PROTOCOLS)]
        protocol: String,
        /// Node i listens on base-port + i - 1 and serves metrics on that port + 100 (with more
        /// than 100 nodes: plus the number of nodes).
        #[arg(long, default_value_t = 7401)]
        base_port: u16,
        /// Where the configuration files and logs go.
        #[arg(long, default_value = "atomos-cluster")]
        dir: PathBuf,
        /// Run an order-layer replica (total order with optimistic delivery) on every node.
        #[arg(long)]
        order: bool,
        /// With --order: closed-loop clients per node generating requests (answered ones are
        /// recorded in each node's data directory, acked.log).
        #[arg(long, default_value_t = 0)]
        order_load: usize,
        /// Threads per node moving money between accounts shared by all nodes; every node
        /// logs a "bank audit" of the total each second (use with --protocol tfa).
        #[arg(long, default_value_t = 0)]
        bank_load: usize,
        /// With --protocol oss: how commits are numbered: ultra-peer, distributed-token or
        /// coordinator-token.
        #[arg(long, default_value = "ultra-peer", value_parser = OSS_COMMIT_MODES)]
        oss_commit: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A benchmark with a process per node writes to its members' pipes: a member that died
    // must be an error there (naming it, and stopping the others), not a signal.
    let pipes_to_members = matches!(&cli.command, Command::Bench(a) if a.talks_to_members());
    if !pipes_to_members
        && matches!(
            cli.command,
            Command::Bench(_)
                | Command::Report { .. }
                | Command::Demo { .. }
                | Command::CheckConfig { .. }
                | Command::Status { .. }
                | Command::Backup { .. }
                | Command::Restore { .. }
                | Command::Member(_)
                | Command::ConfigReference
        )
    {
        // Reports piped into `head` and the like end quietly when the reader goes away, as
        // Unix tools do, instead of panicking on the failed write. (Not for node processes:
        // there a closed socket must be an error, not a signal.)
        // SAFETY: restoring a signal's default disposition at start-up, before any thread
        // exists.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let result = match cli.command {
        Command::Demo {
            duration,
            threads,
            protocol,
        } => seconds(duration, "--duration").and_then(|d| {
            if !(1..=1024).contains(&threads) {
                return Err(format!("--threads must be 1 to 1024, not {threads}"));
            }
            demo::run(protocol.parse()?, d, threads)
        }),
        Command::Bench(args) => bench::run(*args),
        Command::Report { files, out } => report(&files, &out),
        Command::CheckConfig { config } => check_config(config),
        Command::ConfigReference => {
            print!("{}", atomos::config::reference_markdown());
            Ok(true)
        }
        Command::Keygen {
            out,
            force,
            member,
            client,
        } => keygen(&out, force, member, client),
        Command::Node { config } => serve::run(config.as_deref()),
        Command::Member(command) => member::run(command),
        Command::Backup {
            verify: Some(file), ..
        } => backup::verify(&file),
        Command::Backup {
            client: Some(client),
            out: Some(out),
            wait,
            ..
        } => member::wait_seconds(wait).and_then(|w| backup::take(&client, &out, w)),
        Command::Backup { .. } => Err("give --client and --out, or --verify".into()),
        Command::Restore { file, dir, members } => backup::restore(&file, &dir, &members),
        Command::Status { client, wait, json } => {
            member::wait_seconds(wait).and_then(|w| status::run(&client, w, json))
        }
        Command::Cluster(ClusterCommand::Up {
            nodes,
            protocol,
            base_port,
            dir,
            order,
            order_load,
            bank_load,
            oss_commit,
        }) => cluster_up::run(cluster_up::UpArgs {
            nodes,
            protocol,
            base_port,
            dir,
            order,
            order_load,
            bank_load,
            oss_commit,
        }),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(msg) => {
            eprintln!("atomos: {msg}");
            ExitCode::from(2)
        }
    }
}

fn check_config(path: Option<PathBuf>) -> Result<bool, String> {
    let settings =
        atomos::config::load_from_environment(path.as_deref()).map_err(|e| e.to_string())?;
    let mut warnings = atomos::config::exposure_warnings(path.as_deref(), &settings);
    warnings.extend(settings.unused_warnings());
    for w in warnings {
        eprintln!("warning: {w}");
    }
    print!("{}", atomos::config::effective_toml(&settings));
    Ok(true)
}

fn keygen(
    out: &Path,
    force: bool,
    member: Option<u64>,
    client: Option<String>,
) -> Result<bool, String> {
    if member.is_some_and(atomos::net::transport::is_client) {
        return Err("--member: a member's id is below 2^63".into());
    }
    if client.as_deref().is_some_and(|c| c.trim().is_empty()) {
        return Err("--client: the name must not be empty".into());
    }
    let keys = atomos::net::keys::KeyPair::generate().map_err(|e| e.to_string())?;
    let what = match (&member, &client) {
        (Some(id), _) => format!("member {id}"),
        (_, Some(name)) => format!("client {name:?}"),
        _ => "an atomos member or client".to_string(),
    };
    atomos::config::write_key_file(out, &keys, &what, force).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            format!("{} exists: give --force to replace it", out.display())
        } else {
            format!("cannot write {}: {e}", out.display())
        }
    })?;
    let public = keys.public();
    println!("wrote {} (readable by its owner only)", out.display());
    println!("public key: {public}");
    match (member, client) {
        (Some(id), _) => println!(
            "\nevery member's configuration lists it (`key_file = {:?}` in member {id}'s own):\n\n[[peers]]\nid = {id}\naddress = \"HOST:PORT\"\npublic_key = \"{public}\"",
            out.display().to_string()
        ),
        (_, Some(name)) => println!(
            "\nthe members admit it with (then SIGHUP them):\n\n[[clients]]\nname = {name:?}\npublic_key = \"{public}\""
        ),
        _ => {}
    }
    Ok(true)
}

/// The longest time a flag accepts: a year.
const MAX_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

fn seconds(s: f64, what: &str) -> Result<Duration, String> {
    if s.is_finite() && s > 0.0 && s <= MAX_SECONDS {
        Duration::try_from_secs_f64(s).map_err(|e| format!("{what}: {e}"))
    } else {
        Err(format!(
            "{what} must be a positive number of seconds up to a year, not {s}"
        ))
    }
}

/// The values `--protocol` takes (`atomos::Protocol`'s names).
pub(crate) const PROTOCOLS: [&str; 5] = ["local", "tfa", "certify", "active", "oss"];

/// The values `--oss-commit` takes (`CommitMode`'s names).
pub(crate) const OSS_COMMIT_MODES: [&str; 3] =
    ["ultra-peer", "distributed-token", "coordinator-token"];

fn write_json(path: &Option<PathBuf>, value: &impl serde::Serialize) -> Result<(), String> {
    if let Some(path) = path {
        let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

fn report(files: &[PathBuf], out: &std::path::Path) -> Result<bool, String> {
    let points = atomos_bench::report::load(files).map_err(|e| e.to_string())?;
    let written = atomos_bench::report::render(&points, out).map_err(|e| e.to_string())?;
    for path in &written {
        println!("{}", path.display());
    }
    Ok(true)
}

#[cfg(test)]
mod flag_values {
    use super::{OSS_COMMIT_MODES, PROTOCOLS};

    /// The values the flags list are exactly the names the library parses.
    #[test]
    fn the_listed_values_are_the_librarys_names() {
        for p in PROTOCOLS {
            assert_eq!(p.parse::<atomos::Protocol>().unwrap().to_string(), p);
        }
        let modes: Vec<&str> = atomos::protocols::oss::CommitMode::NAMES
            .iter()
            .map(|(n, _)| *n)
            .collect();
        assert_eq!(modes, OSS_COMMIT_MODES);
    }
}
