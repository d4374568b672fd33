#!/usr/bin/env bash
# Runs `atomos bench order` RUNS times (default 5) in three settings and prints a Markdown table
# of medians for docs/BENCHMARKS.md. Usage: scripts/bench-order.sh [RUNS]
runs=${1:-5}
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
settings=(
  "fsync-never|--nodes 3 --request-size 64 --duration 10 --fsync never"
  "fsync-batch|--nodes 3 --request-size 64 --duration 10 --fsync batch"
  "kill-leader-3s|--nodes 3 --request-size 64 --duration 15 --kill-leader-every 3"
)
run_settings "$runs" order "" "${settings[@]}"
python3 - "$out" "$runs" "${settings[@]}" <<'PY'
import json, statistics, sys
out, runs, settings = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print("| setting | command (`atomos bench order ...`) | median ordered/s | runs | revoked / opt-delivered | opt->final p50 / p99 (us) | leader kills |")
print("| --- | --- | ---: | --- | --- | --- | ---: |")
for s in settings:
    name, args = s.split("|")
    rs = [json.load(open(f"{out}/{name}-{i}.json")) for i in range(1, runs + 1)]
    tput = [r["ordered_per_s"] for r in rs]
    med = statistics.median(tput)
    revoked = sum(r["revoked"] for r in rs); opt = sum(r["opt_delivered"] for r in rs)
    p50 = statistics.median(r["opt_to_final_us"]["p50"] for r in rs)
    p99 = statistics.median(r["opt_to_final_us"]["p99"] for r in rs)
    kills = sum(r["leader_kills"] for r in rs)
    runs_s = ", ".join(f"{t/1000:.0f}K" for t in tput)
    print(f"| {name} | `{args}` | {med:,.0f} | {runs_s} | {revoked} / {opt} ({100*revoked/max(opt,1):.2f}%) | {p50:.0f} / {p99:.0f} | {kills} |")
PY
