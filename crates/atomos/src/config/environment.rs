//! The `ATOMOS_` environment variables a node reads, and the refusal of any other: a
//! misspelt variable would otherwise be ignored without a word.

use super::{invalid, ConfigError};

/// Every environment variable a node's configuration reads.
pub const CONFIG_VARIABLES: [&str; 31] = [
    "ATOMOS_CLUSTER",
    "ATOMOS_NODE_ID",
    "ATOMOS_LISTEN",
    "ATOMOS_DATA_DIR",
    "ATOMOS_SECRET",
    "ATOMOS_KEY_FILE",
    "ATOMOS_PROTOCOL",
    "ATOMOS_CONTENTION",
    "ATOMOS_LOG_LEVEL",
    "ATOMOS_LOG_FORMAT",
    "ATOMOS_METRICS",
    "ATOMOS_METRICS_HOT_SPOT_KEYS",
    "ATOMOS_MAX_FRAME_BYTES",
    "ATOMOS_BUSY_POLL_US",
    "ATOMOS_ANSWER_POLL_US",
    "ATOMOS_ORDER",
    "ATOMOS_ORDER_FSYNC",
    "ATOMOS_ORDER_LOAD_CLIENTS",
    "ATOMOS_ORDER_SNAPSHOT_EVERY",
    "ATOMOS_BANK_LOAD_THREADS",
    "ATOMOS_COMMIT_TIMEOUT_MS",
    "ATOMOS_ORDER_REJOIN",
    "ATOMOS_OSS_COMMIT",
    "ATOMOS_OSS_DOMAINS",
    "ATOMOS_SCHED",
    "ATOMOS_SCHED_WORKERS",
    "ATOMOS_RUNTIME_THREADS",
    "ATOMOS_CLIENT_REQUESTS_MAX",
    "ATOMOS_CLIENT_REQUEST_TIMEOUT_MS",
    "ATOMOS_PEERS",
    "ATOMOS_CLIENTS",
];

/// Variables of the project's tests and tools, which are not node settings.
const TOOL_VARIABLES: [&str; 6] = [
    "ATOMOS_SIM_SEED",
    "ATOMOS_SIM_SEEDS",
    "ATOMOS_SIM_TRACE",
    "ATOMOS_FUZZ_INPUTS",
    "ATOMOS_FUZZ_SEED",
    "ATOMOS_FAULT_CASE",
];

/// Refuses any variable among `names` that starts with `ATOMOS_` and that no setting reads,
/// naming it and the setting's variable it is closest to.
pub fn check_variables<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<(), ConfigError> {
    for name in names {
        if !name.starts_with("ATOMOS_")
            || CONFIG_VARIABLES.contains(&name)
            || TOOL_VARIABLES.contains(&name)
        {
            continue;
        }
        let nearest = CONFIG_VARIABLES
            .iter()
            .min_by_key(|known| edit_distance(name, known))
            .map(|known| format!(" (did you mean {known}?)"))
            .unwrap_or_default();
        return Err(invalid(
            name,
            format!("no setting reads this variable{nearest}; unset it"),
        ));
    }
    Ok(())
}

/// Levenshtein distance between two names.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}
