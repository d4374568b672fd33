//! `atomos node`: runs one node until SIGTERM or Ctrl-C; on SIGHUP it re-reads its
//! configuration and admits the clients and members' keys it lists from then on.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use atomos::config::{LogFormat, NodeSettings};
use atomos::NodeRuntime;
use tokio::signal::unix::{signal, SignalKind};
use tracing::{error, info, warn};

use crate::bank_load::{BankLoad, LoadSettings};

/// Loads the configuration, starts the node and serves until told to stop.
pub fn run(config: Option<&Path>) -> Result<bool, String> {
    let settings = atomos::config::load_from_environment(config)
        .map_err(|e| format!("the node does not start: {e}"))?;
    init_logging(&settings.log_level, settings.log_format);
    let mut warnings = atomos::config::exposure_warnings(config, &settings);
    warnings.extend(settings.unused_warnings());
    for w in warnings {
        tracing::warn!("{w}");
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = settings.runtime_threads {
        builder.worker_threads(threads);
    }
    let runtime = builder
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(serve(settings, config.map(Path::to_path_buf)))
}

/// Re-reads the configuration (file and environment) and reloads the keys it lists; a
/// configuration that does not load changes nothing.
fn reload_keys(node: &NodeRuntime, config: Option<&Path>) {
    for var in ["ATOMOS_CLIENTS", "ATOMOS_PEERS"] {
        if std::env::var_os(var).is_some() {
            warn!(
                "SIGHUP: {var} is set, so the keys it lists are still those of this process's \
                 start and the file's are not read: restart the node to change them"
            );
        }
    }
    let settings = match atomos::config::load_from_environment(config) {
        Ok(settings) => settings,
        Err(e) => {
            warn!("SIGHUP: the configuration does not load, nothing changed: {e}");
            return;
        }
    };
    match node.reload_keys(&settings) {
        Ok(r) => info!(
            clients = settings.clients.len(),
            added = ?r.clients_added,
            removed = ?r.clients_removed,
            members_rekeyed = ?r.members_rekeyed,
            "SIGHUP: keys reloaded"
        ),
        Err(e) => warn!("SIGHUP: keys not reloaded: {e}"),
    }
}

/// Structured logs on standard error, at the configured level.
/// Logs to standard error what `level` lets through (`RUST_LOG` instead, if it is set and
/// valid), as text or as one JSON object per line.
fn init_logging(level: &str, format: LogFormat) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| tracing_subscriber::EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new(level));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => logs.json().init(),
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
    }
}

async fn serve(settings: NodeSettings, config: Option<PathBuf>) -> Result<bool, String> {
    // Installed before the node starts, so every counter it registers is exported.
    let mut metrics = None;
    if let Some(addr) = settings.metrics {
        metrics = Some((addr, atomos::endpoint::install_recorder()?));
    }
    let mut terminate =
        signal(SignalKind::terminate()).map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
    let mut hangup =
        signal(SignalKind::hangup()).map_err(|e| format!("cannot watch SIGHUP: {e}"))?;
    // The binary's own procedures, the same on every node (under `active` every replica runs
    // them): registered before the protocol starts.
    let procedures = atomos::Procedures::new();
    crate::bank_load::register(&procedures).map_err(|e| e.to_string())?;
    let node = NodeRuntime::start_tcp_with(&settings, procedures)
        .await
        .map_err(|e| e.to_string())?;
    if let Some((addr, handle)) = metrics {
        let bound = atomos::endpoint::serve(addr, handle, node.health().clone())
            .await
            .map_err(|e| format!("cannot serve metrics on {addr}: {e}"))?;
        info!(addr = %bound, "metrics at http://{bound}/metrics, health at http://{bound}/health");
    }
    let health = node.health().clone();
    let load = (settings.bank_load_threads > 0).then(|| {
        let first = settings
            .peers
            .iter()
            .map(|p| p.id)
            .chain([settings.node_id])
            .min();
        BankLoad::start(
            node.node().clone(),
            LoadSettings {
                threads: settings.bank_load_threads,
                creator: first == Some(settings.node_id),
                ballast_mib: settings.bank_load_ballast_mib,
                pace: settings.bank_load_pace,
            },
        )
    });
    let failure = loop {
        tokio::select! {
            _ = terminate.recv() => { info!("SIGTERM: shutting down"); break None }
            _ = tokio::signal::ctrl_c() => { info!("interrupted: shutting down"); break None }
            cause = health.failed() => break Some(cause),
            _ = hangup.recv() => reload_keys(&node, config.as_deref()),
        }
    };
    if let Some(load) = load {
        // Its threads may wait on answers from peers: stop them before the node.
        tokio::task::spawn_blocking(move || load.stop())
            .await
            .map_err(|e| format!("bank load: {e}"))?;
    }
    node.shutdown();
    if let Some(cause) = failure {
        // Crash-stop: a supervisor restarts the node from its log.
        error!(node = settings.node_id, cause, "node stopped by a failure");
        return Err(format!("node {} failed: {cause}", settings.node_id));
    }
    info!(node = settings.node_id, "node stopped");
    Ok(true)
}
