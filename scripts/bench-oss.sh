#!/usr/bin/env bash
# Runs OSS's micro-benchmarks (section VI-A): RUNS times each (default 5) the linked
# transactions target (private counters, 8 nodes, 10 ms RTT, each commit mode, with and
# without linking) and the ultra-peer commit's latency at 10 ms RTT (transactions that only
# increment, 4 nodes); prints Markdown tables of medians for docs/BENCHMARKS.md. Then sweeps
# the shared counter and the private counters over 1/2/4/8 nodes, the three commit modes and
# 0/5 ms link delays once each, and word count over 1/2/4/8 nodes and the three modes, and
# draws the figures into docs/figures/oss.
# Usage: scripts/bench-oss.sh [RUNS]
runs=${1:-5}
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
counters="private-counters --protocol oss --threads 1 --duration 5 --quiet"
settings=()
for mode in ultra-peer coordinator-token distributed-token; do
  for linked in 0 1; do
    settings+=("linked-$mode-$linked|$counters --nodes 8 --link-delay-ms 5 --oss-commit $mode --linked $linked")
  done
done
settings+=("commit-latency|$counters --nodes 4 --link-delay-ms 5 --work-ms 0 --pause-ms 10")
# Linking hides at most one commit per transaction: with 20 ms of work (about a commit's
# latency here) instead of the paper's 50 + 10 ms, the gain can approach 2x.
for linked in 0 1; do
  settings+=("linked-short-$linked|$counters --nodes 8 --link-delay-ms 5 --work-ms 20 --pause-ms 0 --linked $linked")
done
run_settings "$runs" "" "" "${settings[@]}"
python3 - "$out" "$runs" "${settings[@]}" <<'PY'
import json, statistics, sys
out, runs, settings = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
med = statistics.median
def load(name):
    return [json.load(open(f"{out}/{name}-{i}.json")) for i in range(1, runs + 1)]
print("| setting | command (`atomos bench ...`) | median tx/s | runs | p50 / p99 (us) | invariant |")
print("| --- | --- | ---: | --- | --- | --- |")
medians = {}
for s in settings:
    name, args = s.split("|")
    rs = load(name)
    m = med(r["throughput_tps"] for r in rs)
    medians[name] = (m, med(r["latency_us"]["p50"] for r in rs))
    runs_s = ", ".join(f"{r['throughput_tps']:.0f}" for r in rs)
    ok = "ok" if all(r["invariant_ok"] for r in rs) else "VIOLATED"
    print(f"| {name} | `{args.replace(' --quiet', '')}` | {m:,.0f} | {runs_s} | "
          f"{med(r['latency_us']['p50'] for r in rs):.0f} / {med(r['latency_us']['p99'] for r in rs):.0f} | {ok} |")
print()
for mode in ["ultra-peer", "coordinator-token", "distributed-token"]:
    on, off = medians[f"linked-{mode}-1"][0], medians[f"linked-{mode}-0"][0]
    print(f"- Linked transactions, {mode}, 8 nodes, 10 ms RTT: {on / off:.2f}x the throughput without them")
on, off = medians["linked-short-1"][0], medians["linked-short-0"][0]
print(f"- Linked transactions, ultra-peer, 20 ms of work and no pause: {on / off:.2f}x")
p50 = medians["commit-latency"][1] / 1000
print(f"- Ultra-peer commit at 10 ms RTT, 4 nodes: p50 {p50:.1f} ms (target: 2 RTT + 1 ms = 21 ms)")
PY
mkdir -p "$out/sweep" docs/figures/oss
for w in shared-counter private-counters; do
  $bin bench "$w" --protocol oss --threads 1 --duration 3 --quiet \
    --sweep oss-commit=ultra-peer,coordinator-token,distributed-token --sweep nodes=1,2,4,8 \
    --sweep link-delay-ms=0,5 --json "$out/sweep/$w.json" >/dev/null
done
# Word count (OSS VI-B): lines counted per second against nodes, no added latency.
$bin bench wordcount --protocol oss --threads 1 --duration 3 --quiet \
  --sweep oss-commit=ultra-peer,coordinator-token,distributed-token --sweep nodes=1,2,4,8 \
  --json "$out/sweep/wordcount.json" >/dev/null
$bin report "$out"/sweep/*.json --out docs/figures/oss
for f in "$out"/sweep/*.json; do
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['workload'], r['oss_commit'], r['nodes'], r['link_delay_ms'], round(r['throughput_tps']), round(r['abort_rate'], 3))" "$f"
done
