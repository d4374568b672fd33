#!/usr/bin/env bash
# Runs the macro workloads (Vacation, Loan, TPC-C) on the local engine RUNS times each (default
# 3, 5 s per run, 2 threads), prints Markdown tables of medians for docs/BENCHMARKS.md, then
# sweeps threads 1,2,4 for each and draws the figures into FIGURES (default docs/figures).
# Usage: scripts/bench-macro.sh [RUNS] [FIGURES]
runs=${1:-3}
figures=${2:-docs/figures}
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"

targets=(
  "vacation|vacation|200000"
  "loan|loan|300000"
  "tpcc-standard|tpcc --warehouses 2|50000"
  "tpcc-read-heavy|tpcc --warehouses 2 --mix read-heavy|"
)
run_settings "$runs" "" "--threads 2 --duration 5 --quiet" "${targets[@]}"

python3 - "$out" "$runs" "${targets[@]}" <<'PY'
import json, statistics, sys
out, runs, targets = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
med = statistics.median
def load(name):
    return [json.load(open(f"{out}/{name}-{i}.json")) for i in range(1, runs + 1)]
print("| benchmark | command (`atomos bench ...`, `--threads 2 --duration 5`) | median tx/s | runs | target | abort rate | p50 / p99 latency (us) | invariant |")
print("| --- | --- | ---: | --- | ---: | ---: | --- | --- |")
for t in targets:
    name, args, target = t.split("|")
    rs = load(name)
    m = med(r["throughput_tps"] for r in rs)
    runs_s = ", ".join(f"{r['throughput_tps']/1e3:.0f}K" for r in rs)
    tgt = f"{int(target):,}" + (" met" if m >= int(target) else " **not met**") if target else "-"
    print(f"| {name} | `{args}` | {m:,.0f} | {runs_s} | {tgt} | {med(r['abort_rate'] for r in rs):.4f} | "
          f"{med(r['latency_us']['p50'] for r in rs):.2f} / {med(r['latency_us']['p99'] for r in rs):.2f} | "
          f"{'ok' if all(r['invariant_ok'] for r in rs) else 'VIOLATED'} |")
for t in targets:
    name, args, _ = t.split("|")
    rs = load(name)
    print()
    print(f"Per operation, {name} (`{args}`), medians of {runs} runs:")
    print()
    print("| operation | share | tx/s | p50 (us) | p90 (us) | p99 (us) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for k, p in enumerate(rs[0]["profiles"]):
        ps = [r["profiles"][k] for r in rs]
        print(f"| {p['name']} | {100 * med(x['share'] for x in ps):.1f}% | {med(x['throughput_tps'] for x in ps):,.0f} | "
              f"{med(x['latency_us']['p50'] for x in ps):.2f} | {med(x['latency_us']['p90'] for x in ps):.2f} | "
              f"{med(x['latency_us']['p99'] for x in ps):.2f} |")
PY

mkdir -p "$figures" "$out/sweep"
for w in "vacation|vacation" "loan|loan" "tpcc|tpcc --warehouses 2 --sweep mix=standard,read-heavy"; do
  IFS='|' read -r name args <<<"$w"
  # shellcheck disable=SC2086
  $bin bench $args --sweep threads=1,2,4 --duration 3 --quiet --json "$out/sweep/$name.json" >/dev/null
done
$bin report "$out"/sweep/*.json --out "$figures" | grep -c . | xargs echo "figures written to $figures:"
