//! The `ATOMOS_` environment variables a node reads, and the refusal of any other: a
//! misspelt variable would otherwise be ignored without a word.

use super::{invalid, ConfigError};

/// Every environment variable a node's configuration reads: one per key of
/// [`SETTINGS`](super::SETTINGS).
pub fn config_variables() -> Vec<String> {
    super::SETTINGS.iter().map(|s| s.variable()).collect()
}

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
    let known = config_variables();
    for name in names {
        if !name.starts_with("ATOMOS_")
            || known.iter().any(|k| k == name)
            || TOOL_VARIABLES.contains(&name)
        {
            continue;
        }
        let nearest = nearest(name, known.iter().map(String::as_str))
            .map(|known| format!(" (did you mean {known}?)"))
            .unwrap_or_default();
        return Err(invalid(
            name,
            format!("no setting reads this variable{nearest}; unset it"),
        ));
    }
    Ok(())
}

/// The name among `known` closest to `name`.
pub(super) fn nearest<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    known.min_by_key(|k| edit_distance(name, k))
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
