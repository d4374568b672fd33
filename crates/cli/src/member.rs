//! `atomos member`: lists the members of a `certify` or `active` cluster as its log holds
//! them, and asks for changes (a learner added, promoted, a member removed or replaced). Changes
//! need a client the members list in `operators`; the leader proposes them, wherever it is.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use atomos::status::latest_view;
use atomos::{Client, MemberRequest};
use clap::Subcommand;

/// What `atomos member` does.
#[derive(Subcommand, Debug)]
pub(crate) enum MemberCommand {
    /// Lists the members as the cluster's log holds them: id, role (voter, learner, leaving)
    /// and address.
    #[command(allow_negative_numbers = true)]
    List {
        /// The client configuration (`client.toml`).
        #[arg(long, value_name = "FILE")]
        client: PathBuf,
        /// Seconds to wait for each member's answer (up to 3600).
        #[arg(long, default_value_t = 3.0)]
        wait: f64,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Adds a member as a learner: it receives the log and votes on nothing until promoted.
    /// Start it first with `order_join = true`.
    #[command(allow_negative_numbers = true)]
    Add {
        /// The client configuration of an operator.
        #[arg(long, value_name = "FILE")]
        client: PathBuf,
        /// The new member's id.
        #[arg(long)]
        id: u64,
        /// Where it listens (`ip:port`).
        #[arg(long)]
        address: String,
        /// Its public key, as `atomos keygen` prints it (twice while it rotates its key).
        #[arg(long = "public-key", required = true)]
        public_key: Vec<String>,
        /// Seconds to keep asking until a leader proposes it (up to 3600).
        #[arg(long, default_value_t = 10.0)]
        wait: f64,
    },
    /// Makes a learner a voter (refused until it delivered what was committed when first asked).
    #[command(allow_negative_numbers = true)]
    Promote {
        /// The client configuration of an operator.
        #[arg(long, value_name = "FILE")]
        client: PathBuf,
        /// The learner's id.
        #[arg(long)]
        id: u64,
        /// Seconds to keep asking until a leader proposes it (up to 3600).
        #[arg(long, default_value_t = 10.0)]
        wait: f64,
    },
    /// Removes a member (the leader too: it steps down).
    #[command(allow_negative_numbers = true)]
    Remove {
        /// The client configuration of an operator.
        #[arg(long, value_name = "FILE")]
        client: PathBuf,
        /// The member's id.
        #[arg(long)]
        id: u64,
        /// Seconds to keep asking until a leader proposes it (up to 3600).
        #[arg(long, default_value_t = 10.0)]
        wait: f64,
    },
    /// Promotes a learner and removes a voter in one change.
    #[command(allow_negative_numbers = true)]
    Replace {
        /// The client configuration of an operator.
        #[arg(long, value_name = "FILE")]
        client: PathBuf,
        /// The voter that goes.
        #[arg(long)]
        remove: u64,
        /// The learner that takes its place.
        #[arg(long)]
        add: u64,
        /// Seconds to keep asking until a leader proposes it (up to 3600).
        #[arg(long, default_value_t = 10.0)]
        wait: f64,
    },
}

/// `wait` seconds as a duration, if it is a positive number up to an hour.
pub(crate) fn wait_seconds(wait: f64) -> Result<Duration, String> {
    match Duration::try_from_secs_f64(wait) {
        Ok(w) if !w.is_zero() && w <= Duration::from_secs(3600) => Ok(w),
        _ => Err(format!(
            "--wait must be a positive number of seconds up to 3600, not {wait}"
        )),
    }
}

/// Runs the command: `Ok(true)` when listed or proposed, `Ok(false)` when the cluster refused
/// or no member proposed it in time (said on stderr), `Err` for bad input or a client that
/// cannot start.
pub(crate) fn run(command: MemberCommand) -> Result<bool, String> {
    let (client, wait, request) = match command {
        MemberCommand::List { client, wait, json } => {
            return list(&client, wait_seconds(wait)?, json)
        }
        MemberCommand::Add {
            client,
            id,
            address,
            public_key,
            wait,
        } => {
            let request = MemberRequest::AddLearner {
                id,
                address,
                public_keys: public_key,
            };
            (client, wait, request)
        }
        MemberCommand::Promote { client, id, wait } => {
            (client, wait, MemberRequest::Promote { id })
        }
        MemberCommand::Remove { client, id, wait } => (client, wait, MemberRequest::Remove { id }),
        MemberCommand::Replace {
            client,
            remove,
            add,
            wait,
        } => (client, wait, MemberRequest::Replace { remove, add }),
    };
    let wait = wait_seconds(wait)?;
    // What the members would refuse as malformed is refused here, before connecting.
    request
        .to_change()
        .map_err(|e| format!("--{}", flag_of(&e, &request)))?;
    let result = with_client(&client, |client| async move {
        client.change_membership(request, wait).await
    })?;
    match result {
        Ok(at) => {
            println!("proposed at log position {at}: `atomos member list` shows it once applied");
            Ok(true)
        }
        Err(refusal) => {
            eprintln!("atomos: refused: {refusal}");
            Ok(false)
        }
    }
}

/// The flag a malformed request's error is about, with the error.
fn flag_of(error: &str, request: &MemberRequest) -> String {
    match request {
        MemberRequest::AddLearner { .. } if error.starts_with("address") => {
            format!("address: {error}")
        }
        MemberRequest::AddLearner { .. } if error.starts_with("member id") => {
            format!("id: {error}")
        }
        _ => format!("public-key: {error}"),
    }
}

/// Connects with the client configuration at `path` and runs `f` with the client.
fn with_client<F, Fut, T>(path: &Path, f: F) -> Result<T, String>
where
    F: FnOnce(std::sync::Arc<Client>) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let cfg = atomos::config::load_client(path).map_err(|e| format!("--client: {e}"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(async move {
        let client = std::sync::Arc::new(Client::connect(cfg).await.map_err(|e| e.to_string())?);
        let out = f(client.clone()).await;
        client.close();
        Ok(out)
    })
}

/// One member as `member list` shows it.
#[derive(serde::Serialize)]
struct Listed {
    id: u64,
    role: &'static str,
    address: Option<String>,
}

/// Lists the members as the member that applied the most of the log holds them.
fn list(path: &Path, wait: Duration, json: bool) -> Result<bool, String> {
    let reports = with_client(path, |client| async move { client.status(wait).await })?;
    let Some(view) = latest_view(&reports) else {
        return Err(
            "no member reported a membership: is the cluster running certify or active?".into(),
        );
    };
    let mut addresses: BTreeMap<u64, String> = reports
        .iter()
        .map(|r| (r.id, r.address.to_string()))
        .collect();
    addresses.extend(view.addresses.iter().cloned());
    let mut listed = Vec::new();
    let roles = [
        (&view.voters, "voter"),
        (&view.outgoing, "leaving"),
        (&view.learners, "learner"),
    ];
    for (ids, role) in roles {
        for &id in ids {
            if !listed.iter().any(|l: &Listed| l.id == id) {
                let address = addresses.get(&id).cloned();
                listed.push(Listed { id, role, address });
            }
        }
    }
    listed.sort_by_key(|l| l.id);
    if json {
        let text = serde_json::to_string_pretty(&listed).map_err(|e| e.to_string())?;
        println!("{text}");
    } else {
        println!("{:<6} {:<8} ADDRESS", "ID", "ROLE");
        for l in &listed {
            let address = l.address.as_deref().unwrap_or("-");
            println!("{:<6} {:<8} {address}", l.id, l.role);
        }
    }
    Ok(true)
}
