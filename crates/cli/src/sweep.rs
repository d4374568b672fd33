//! `atomos bench ... --sweep PARAM=V1,V2,...`: one run per point of the parameter grid, each
//! written to a JSON file of its own.

use std::path::{Path, PathBuf};

/// One swept parameter and its values.
#[derive(Clone, Debug, PartialEq)]
pub struct Sweep {
    /// The bench flag's name without dashes, e.g. `threads` or `read-ratio`.
    pub param: String,
    /// Its values, as given.
    pub values: Vec<String>,
}

/// Flags a sweep can vary.
pub const SWEEPABLE: [&str; 23] = [
    "threads",
    "nodes",
    "read-ratio",
    "objects",
    "inner",
    "queries",
    "warehouses",
    "balance-k",
    "protocol",
    "transport",
    "nesting",
    "mix",
    "scale",
    "contention",
    "oss-commit",
    "link-delay-ms",
    "linked",
    "sched",
    "arrival-rate",
    "cmax",
    "answer-poll-us",
    "busy-poll-us",
    "runtime-threads",
];

impl std::str::FromStr for Sweep {
    type Err = String;

    /// `PARAM=V1,V2,...` with PARAM one of [`SWEEPABLE`] and at least one value.
    fn from_str(s: &str) -> Result<Sweep, String> {
        let (param, values) = s.split_once('=').ok_or_else(|| {
            format!("--sweep {s:?}: expected PARAM=V1,V2,... (e.g. threads=1,2,4)")
        })?;
        let param = param.trim().trim_start_matches("--").to_string();
        if !SWEEPABLE.contains(&param.as_str()) {
            return Err(format!(
                "--sweep cannot vary {param:?} (it can vary: {})",
                SWEEPABLE.join(", ")
            ));
        }
        let values: Vec<String> = values
            .split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect();
        if values.is_empty() {
            return Err(format!("--sweep {param}: no values given"));
        }
        Ok(Sweep { param, values })
    }
}

/// Every point of the grid the sweeps span, as (param, value) settings, the first sweep
/// varying slowest.
pub fn grid(sweeps: &[Sweep]) -> Vec<Vec<(String, String)>> {
    let mut points = vec![Vec::new()];
    for sweep in sweeps {
        points = points
            .into_iter()
            .flat_map(|point: Vec<(String, String)>| {
                sweep.values.iter().map(move |v| {
                    let mut p = point.clone();
                    p.push((sweep.param.clone(), v.clone()));
                    p
                })
            })
            .collect();
    }
    points
}

/// The file a point's result goes to: `--json`'s path with the settings added to its stem,
/// e.g. `out/bank.json` -> `out/bank-threads-4-read-ratio-0.5.json`.
pub fn point_path(json: &Path, point: &[(String, String)]) -> PathBuf {
    let stem = json
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "bench".into());
    let mut name = stem;
    for (param, value) in point {
        name.push_str(&format!("-{param}-{value}"));
    }
    name.push_str(".json");
    json.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_parse_and_span_a_grid() {
        let threads: Sweep = "threads=1,2,4".parse().unwrap();
        let ratio: Sweep = "--read-ratio=0.2, 0.8".parse().unwrap();
        assert_eq!(ratio.values, ["0.2", "0.8"]);
        let points = grid(&[threads, ratio]);
        assert_eq!(points.len(), 6);
        assert_eq!(
            points[1],
            [
                ("threads".to_string(), "1".to_string()),
                ("read-ratio".to_string(), "0.8".to_string())
            ]
        );
        assert_eq!(
            point_path(Path::new("out/bank.json"), &points[5]),
            PathBuf::from("out/bank-threads-4-read-ratio-0.8.json")
        );
    }

    #[test]
    fn bad_sweeps_are_refused() {
        assert!("threads".parse::<Sweep>().unwrap_err().contains("PARAM="));
        assert!("duration=1,2"
            .parse::<Sweep>()
            .unwrap_err()
            .contains("cannot vary"));
        assert!("threads="
            .parse::<Sweep>()
            .unwrap_err()
            .contains("no values"));
    }
}
