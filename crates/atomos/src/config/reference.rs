//! The configuration reference (docs/guide/configuration.md), generated from the settings
//! table so that it lists every key the code reads, and nothing else.

use std::fmt::Write;

use super::setting::Setting;
use super::table::defaults;
use super::SETTINGS;

/// A setting's default as the reference shows it.
fn default_of(row: &Setting) -> String {
    if let Some(note) = row.default_note {
        return note.to_string();
    }
    match row.show(&defaults()) {
        Some(value) => format!("`{value}`"),
        None => "unset".to_string(),
    }
}

/// The reference in Markdown: a summary table of every key (its variable, shape, default and
/// readers), then each key's meaning.
pub fn reference_markdown() -> String {
    let mut out = String::new();
    out.push_str(
        "# Configuration reference\n\n\
         <!-- Generated from crates/atomos/src/config/table.rs by \
         `cargo run -p atomos-cli -- config-reference`; a test keeps it equal. -->\n\n\
         A node reads a TOML file (`atomos node --config FILE`) and the environment: every key \
         has an `ATOMOS_` variable that, if set, wins over the file. `atomos check-config \
         --config FILE` validates both and prints the effective configuration (the secret \
         hidden). A bad value is refused at start with the key (or variable) that gave it; an \
         unknown key, or an `ATOMOS_` variable no key reads, is refused too. A key the chosen \
         protocol does not read is accepted with a warning.\n\n\
         | Key | Variable | Type | Default | Read by |\n\
         |---|---|---|---|---|\n",
    );
    for row in SETTINGS.iter() {
        let _ = writeln!(
            out,
            "| [`{key}`](#{key}) | `{var}` | {kind} | {default} | {readers} |",
            key = row.key,
            var = row.variable(),
            kind = row.kind.name(),
            default = default_of(row),
            readers = row.readers.describe(),
        );
    }
    out.push_str("\n## Keys\n");
    for row in SETTINGS.iter() {
        let _ = write!(
            out,
            "\n### {key}\n\n{meaning}\n\n`{var}` · {kind} · default {default} · read by {readers}\n",
            key = row.key,
            meaning = row.meaning,
            var = row.variable(),
            kind = row.kind.name(),
            default = default_of(row),
            readers = row.readers.describe(),
        );
    }
    out
}
