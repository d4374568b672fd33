# Shared by the bench scripts (source it): goes to the repository root, builds the release
# binary, and sets `bin` (the binary) and `out` (a scratch directory removed on exit).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# BENCH_BIN runs another build (one copied aside, for an A/B sitting) instead of building.
if [ -n "${BENCH_BIN:-}" ]; then
  bin=$BENCH_BIN
else
  cargo build --release -q -p atomos-cli
  bin=target/release/atomos
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# run_settings RUNS BEFORE AFTER SETTING...: for each "NAME|ARGS[|...]" setting, runs
# `atomos bench BEFORE ARGS AFTER --json $out/NAME-I.json` RUNS times (I from 1).
run_settings() {
  local runs=$1 before=$2 after=$3 s name args i
  shift 3
  for s in "$@"; do
    IFS='|' read -r name args _ <<<"$s"
    for i in $(seq "$runs"); do
      # shellcheck disable=SC2086
      $bin bench $before $args $after --json "$out/$name-$i.json" >/dev/null
    done
  done
}
