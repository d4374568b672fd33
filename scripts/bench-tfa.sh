#!/usr/bin/env bash
# Runs `atomos bench bank --protocol tfa` RUNS times (default 5) in each setting and prints a
# Markdown table of medians for docs/BENCHMARKS.md. Usage: scripts/bench-tfa.sh [RUNS]
runs=${1:-5}
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
common="--protocol tfa --nodes 4 --threads 4 --objects 10000 --read-ratio 0.5 --duration 5 --quiet"
settings=(
  "bank-tcp-k2|bank $common --transport tcp --balance-k 2"
  "bank-tcp-k2-fibers|bank $common --transport tcp --balance-k 2 --fibers"
  "bank-tcp-k2-processes|bank $common --transport tcp --balance-k 2 --processes"
  "bank-tcp-k2-processes-fibers|bank $common --transport tcp --balance-k 2 --processes --fibers"
  "bank-tcp-k2-processes-fibers-rt1|bank $common --transport tcp --balance-k 2 --processes --fibers --runtime-threads 1"
  "bank-memory-k2|bank $common --transport memory --balance-k 2"
  "bank-memory-k2-fibers|bank $common --transport memory --balance-k 2 --fibers"
  "hashtable-tcp|hashtable --protocol tfa --nodes 4 --threads 4 --read-ratio 0.5 --duration 5 --quiet --transport tcp"
  "hashtable-tcp-fibers|hashtable --protocol tfa --nodes 4 --threads 4 --read-ratio 0.5 --duration 5 --quiet --transport tcp --fibers"
)
run_settings "$runs" "" "" "${settings[@]}"
python3 - "$out" "$runs" "${settings[@]}" <<'PY'
import json, statistics, sys
out, runs, settings = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print("| setting | command (`atomos bench ...`) | median tx/s | runs | abort rate | p50 / p99 (us) | invariant |")
print("| --- | --- | ---: | --- | ---: | --- | --- |")
for s in settings:
    name, args = s.split("|")
    rs = [json.load(open(f"{out}/{name}-{i}.json")) for i in range(1, runs + 1)]
    tput = [r["throughput_tps"] for r in rs]
    med = statistics.median(tput)
    ab = statistics.median(r["abort_rate"] for r in rs)
    p50 = statistics.median(r["latency_us"]["p50"] for r in rs)
    p99 = statistics.median(r["latency_us"]["p99"] for r in rs)
    ok = "ok" if all(r["invariant_ok"] for r in rs) else "VIOLATED"
    runs_s = ", ".join(f"{t/1000:.1f}K" for t in tput)
    print(f"| {name} | `{args.replace(' --quiet', '')}` | {med:,.0f} | {runs_s} | {ab:.4f} | {p50:.0f} / {p99:.0f} | {ok} |")
PY
