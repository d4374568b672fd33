#!/usr/bin/env bash
# Runs the `certify` targets RUNS times (default 5) each and prints a Markdown table of
# medians for docs/BENCHMARKS.md; then sweeps Paxos STM's configurations (hash table and bank
# at 10/50/90% read-only on 1, 3 and 5 replicas) once each and redraws their figures into
# docs/figures/certify. Usage: scripts/bench-certify.sh [RUNS]
runs=${1:-5}
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
bank="bank --protocol certify --nodes 3 --transport tcp --objects 10000 --duration 5 --quiet"
settings=(
  "bank-66-threads-fsync-never|$bank --threads 22 --read-ratio 0.5 --balance-k 10 --fsync never"
  "bank-66-threads-fsync-batch|$bank --threads 22 --read-ratio 0.5 --balance-k 10 --fsync batch"
  "transfer-1-thread-per-node|$bank --threads 1 --read-ratio 0 --fsync never"
  "bank-66-fibers-fsync-never|$bank --threads 22 --read-ratio 0.5 --balance-k 10 --fsync never --fibers"
  "bank-66-fibers-fsync-batch|$bank --threads 22 --read-ratio 0.5 --balance-k 10 --fsync batch --fibers"
  "transfer-1-fiber-per-node|$bank --threads 1 --read-ratio 0 --fsync never --fibers"
)
run_settings "$runs" "" "" "${settings[@]}"
python3 - "$out" "$runs" "${settings[@]}" <<'PY'
import json, statistics, sys
out, runs, settings = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print("| setting | command (`atomos bench ...`) | median tx/s | runs | abort rate | transfer p50 / p99 (us) | invariant |")
print("| --- | --- | ---: | --- | ---: | --- | --- |")
for s in settings:
    name, args = s.split("|")
    rs = [json.load(open(f"{out}/{name}-{i}.json")) for i in range(1, runs + 1)]
    tput = [r["throughput_tps"] for r in rs]
    med = statistics.median(tput)
    ab = statistics.median(r["abort_rate"] for r in rs)
    tr = [next(p for p in r["profiles"] if p["name"] == "transfer") for r in rs]
    p50 = statistics.median(p["latency_us"]["p50"] for p in tr)
    p99 = statistics.median(p["latency_us"]["p99"] for p in tr)
    ok = "ok" if all(r["invariant_ok"] for r in rs) else "VIOLATED"
    runs_s = ", ".join(f"{t/1000:.1f}K" for t in tput)
    print(f"| {name} | `{args.replace(' --quiet', '')}` | {med:,.0f} | {runs_s} | {ab:.4f} | {p50:.0f} / {p99:.0f} | {ok} |")
PY
# Paxos STM's configurations, one run per point, drawn as figures.
mkdir -p "$out/sweep" docs/figures/certify
for w in hashtable bank; do
  $bin bench $w --protocol certify --transport tcp --threads 2 --duration 4 --quiet \
    --sweep nodes=1,3,5 --sweep read-ratio=0.1,0.5,0.9 --json "$out/sweep/$w.json" >/dev/null
done
$bin report "$out"/sweep/*.json --out docs/figures/certify
