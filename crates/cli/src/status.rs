//! `atomos status`: asks every member of a cluster where it stands and prints one line per
//! member and a verdict on whether the cluster can commit.

use std::path::Path;
use std::time::Duration;

use atomos::status::{ClusterSummary, MemberReport};
use atomos::Client;

/// Connects with the client configuration at `config`, asks every member (each for up to
/// `wait`), and prints a table (or JSON). Answers whether the cluster can commit with every
/// member answering.
pub(crate) fn run(config: &Path, wait: Duration, json: bool) -> Result<bool, String> {
    let cfg = atomos::config::load_client(config).map_err(|e| format!("--client: {e}"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let reports = runtime.block_on(async move {
        let client = Client::connect(cfg).await.map_err(|e| e.to_string())?;
        let reports = client.status(wait).await;
        client.close();
        Ok::<_, String>(reports)
    })?;
    let summary = ClusterSummary::of(&reports);
    if json {
        let doc = serde_json::json!({ "cluster": summary, "members": reports });
        let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        println!("{text}");
    } else {
        print!("{}", table(&reports, &summary));
    }
    Ok(summary.can_commit && summary.answered == summary.members)
}

/// The members as a table, then the verdict.
fn table(reports: &[MemberReport], summary: &ClusterSummary) -> String {
    let mut rows = vec![[
        "ID", "ADDRESS", "ROLE", "TERM", "COMMIT", "APPLIED", "LAG", "STATE",
    ]
    .map(String::from)
    .to_vec()];
    for r in reports {
        let mut row = vec![r.id.to_string(), r.address.to_string()];
        match &r.status {
            Err(why) => {
                row.extend(["unreachable", "-", "-", "-", "-"].map(String::from));
                row.push(why.clone());
            }
            Ok(s) => {
                row.push(s.role().to_string());
                match &s.replica {
                    Some(rep) => row.extend([
                        rep.term.to_string(),
                        rep.commit.to_string(),
                        rep.applied.to_string(),
                        summary
                            .highest_commit
                            .saturating_sub(rep.applied)
                            .to_string(),
                    ]),
                    None => row.extend(["-", "-", "-", "-"].map(String::from)),
                }
                let state = match (&s.failure, &s.not_ready) {
                    (Some(f), _) => format!("failed: {f}"),
                    (None, Some(why)) => format!("not ready: {why}"),
                    (None, None) => "ready".to_string(),
                };
                let refused = s
                    .replica
                    .as_ref()
                    .and_then(|rep| rep.last_refused.as_ref())
                    .map_or(String::new(), |why| format!(" (refused send: {why})"));
                row.push(format!("{state}{refused}"));
            }
        }
        rows.push(row);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (cell, w))| {
                if c + 1 == row.len() {
                    cell.clone()
                } else {
                    format!("{cell:<w$}")
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out.push_str(&summary.verdict);
    out.push('\n');
    out
}
