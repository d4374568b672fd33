//! What a node's settings expose, said as warnings at its start.

use std::path::Path;

use super::NodeSettings;

/// Warnings about what the settings expose: a configuration file at `path` that holds the
/// cluster secret and can be read by its group or by others (`cluster up` writes its files
/// readable by their owner only), and a metrics endpoint reachable from other machines (it has
/// no authentication).
pub fn exposure_warnings(path: Option<&Path>, settings: &NodeSettings) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    let mut warnings = Vec::new();
    let mode = path.and_then(|p| Some((p, std::fs::metadata(p).ok()?.permissions().mode())));
    let holds_secret = settings.secret.is_some() && std::env::var_os("ATOMOS_SECRET").is_none();
    if let Some((path, mode)) = mode.filter(|(_, mode)| holds_secret && mode & 0o077 != 0) {
        warnings.push(format!(
            "{} holds the cluster secret and can be read by its group or others (mode {:o}); \
             make it readable by its owner only (chmod 600)",
            path.display(),
            mode & 0o777
        ));
    }
    if let Some(metrics) = settings.metrics.filter(|a| !a.ip().is_loopback()) {
        warnings.push(format!(
            "the metrics endpoint listens on {metrics}, reachable from other machines, and \
             has no authentication; give a port alone to serve it on 127.0.0.1 only"
        ));
    }
    warnings
}
