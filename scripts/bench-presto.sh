#!/usr/bin/env bash
# Runs PRESTO's experiment (chapter 6) on TPC-C: requests arrive as a Poisson process at RATE
# per second (default 40000: near saturation of one worker here), each at its profile's
# priority (table 6.1), on one worker (the arrivals take the machine's other core); RUNS times
# (default 3) each policy, the policies interleaved. Prints a Markdown table of medians for
# docs/BENCHMARKS.md with the targets, and draws the figures into docs/figures/presto.
# Usage: [KEEP=DIR] scripts/bench-presto.sh [RUNS] [RATE] (KEEP: where to copy the runs' JSON)
runs=${1:-3}
rate=${2:-40000}
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
common="tpcc --threads 1 --duration 5 --contexts 1024 --arrival-rate $rate --quiet"
policies=("none|--sched none" "preemptive|--sched preemptive" "cmax|--sched cmax --cmax 4"
  "lazy|--sched lazy --cmax 4")
for i in $(seq "$runs"); do
  for p in "${policies[@]}"; do
    IFS='|' read -r name args <<<"$p"
    # shellcheck disable=SC2086
    $bin bench $common $args --json "$out/$name-$i.json" >/dev/null
  done
done
python3 - "$out" "$runs" "$common" <<'PY'
import json, statistics, sys
out, runs, common = sys.argv[1], int(sys.argv[2]), sys.argv[3]
med = statistics.median
names = ["none", "preemptive", "cmax", "lazy"]
rs = {n: [json.load(open(f"{out}/{n}-{i}.json")) for i in range(1, runs + 1)] for n in names}
levels = ["1", "2", "3", "4", "5"]
def m(n, f):
    return med(f(r) for r in rs[n])
print(f"`atomos bench {common.replace(' --quiet', '')} --sched ...`, medians of {runs} runs:\n")
print("| policy | mean turnaround per priority 1 / 2 / 3 / 4 / 5 (us) | p99 turnaround 1 / 2 / 3 / 4 / 5 (us) | mean execution 4 / 5 (us) | mean running 1 / 2 / 3 / 4 / 5 (us) | reaction p50 / p99 at priority 5 (us) | preemptions | workers busy | context pool busy | checks |")
print("| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: | --- |")
for n in names:
    mean = " / ".join(f"{m(n, lambda r: r['turnaround_us'][l]['mean']):,.0f}" for l in levels)
    p99 = " / ".join(f"{m(n, lambda r: r['turnaround_us'][l]['p99']):,.0f}" for l in levels)
    react = f"{m(n, lambda r: r['reaction_us']['5']['p50']):.1f} / {m(n, lambda r: r['reaction_us']['5']['p99']):.1f}"
    ok = "ok" if all(r["invariant_ok"] for r in rs[n]) else "VIOLATED"
    label = n if n in ("none", "preemptive") else f"{n} (C_max 4)"
    execution = " / ".join(f"{m(n, lambda r: r['execution_us'][l]['mean']):,.1f}" for l in ["4", "5"])
    running = " / ".join(f"{m(n, lambda r: r['running_us'][l]['mean']):,.1f}" for l in levels)
    print(f"| {label} | {mean} | {p99} | {execution} | {running} | {react} | {m(n, lambda r: r['preemptions']):,.0f} | "
          f"{m(n, lambda r: r['utilization']):.2f} | {m(n, lambda r: r['context_pool_busy']):.3f} | {ok} |")
print()
base = {l: m("none", lambda r: r["turnaround_us"][l]["mean"]) for l in levels}
for n in names[1:]:
    change = {l: m(n, lambda r: r["turnaround_us"][l]["mean"]) / base[l] - 1 for l in levels}
    print(f"- {n}: mean turnaround against none: " + ", ".join(
        f"priority {l} {100 * change[l]:+.0f}%" for l in levels)
        + " (targets: 5 and 4 at least -80%, 1 and 2 at most +5%); reaction p99 at priority 5 "
        f"{m(n, lambda r: r['reaction_us']['5']['p99']):.1f} us (target 20); priority 5's own "
        f"execution bounds its saving at {100 * (m(n, lambda r: r['execution_us']['5']['mean']) / base['5'] - 1):+.0f}%")
PY
mkdir -p docs/figures/presto
if [ -n "${KEEP:-}" ]; then cp "$out"/*.json "$KEEP"/; fi
$bin report "$out"/*.json --out docs/figures/presto >/dev/null
echo "figures: docs/figures/presto"
