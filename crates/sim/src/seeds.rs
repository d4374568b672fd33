//! Which seeds a simulation test runs, and how a failure says how to replay it.

/// The environment variable that narrows a simulation test to one seed.
pub const SEED_VAR: &str = "ATOMOS_SIM_SEED";

/// The environment variable that widens a simulation test to more seeds.
pub const SEEDS_VAR: &str = "ATOMOS_SIM_SEEDS";

/// The seeds to run: only the seed in `ATOMOS_SIM_SEED` when it is set (to replay one), else
/// `0..max(N, count)` for `ATOMOS_SIM_SEEDS=N`: the variable widens a test's seed set and never
/// narrows it.
pub fn seeds(count: u64) -> Vec<u64> {
    let var = |name| std::env::var(name).ok().and_then(|s| s.parse::<u64>().ok());
    match (var(SEED_VAR), var(SEEDS_VAR)) {
        (Some(seed), _) => vec![seed],
        (None, Some(n)) => (0..n.max(count)).collect(),
        (None, None) => (0..count).collect(),
    }
}

/// Runs `check` on every seed of [`seeds`]`(count)`; on the first failure panics with the seed,
/// the reason and the command that replays it (`target` is the package and test, for example
/// `-p atomos-sim --test store`).
pub fn check_seeds(count: u64, target: &str, mut check: impl FnMut(u64) -> Result<(), String>) {
    for seed in seeds(count) {
        if let Err(e) = check(seed) {
            panic!("seed {seed}: {e}\nreplay: {SEED_VAR}={seed} cargo test {target}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seeds_variable_only_widens() {
        // The variables are read at call time; this test owns them in this process.
        std::env::remove_var(SEED_VAR);
        std::env::set_var(SEEDS_VAR, "3");
        assert_eq!(seeds(10), (0..10).collect::<Vec<_>>());
        std::env::set_var(SEEDS_VAR, "12");
        assert_eq!(seeds(10).len(), 12);
        std::env::remove_var(SEEDS_VAR);
        assert_eq!(seeds(4), vec![0, 1, 2, 3]);
    }
}
