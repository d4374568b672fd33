#!/usr/bin/env bash
# Runs the `active` targets against `certify` RUNS times each (default 5): TPC-C (standard and
# read-heavy mixes, 1 and 3 warehouses, 3 replicas over TCP) and the speculative executor
# alone; prints Markdown tables of medians for docs/BENCHMARKS.md. Then sweeps the bank at
# 500 / 2,000 / 5,000 accounts and 10/50/90% read-only on both protocols once each and draws
# the figures into docs/figures/active. Also the order layer with the active store on its
# replicas (bank transfers as procedures), failure-free and with the leader stopped every 3 s:
# revoked optimistic deliveries and confirmed speculations. Usage: scripts/bench-active.sh [RUNS]
runs=${1:-5}
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
tpcc="tpcc --nodes 3 --transport tcp --threads 4 --duration 5 --quiet"
settings=()
for mix in standard read-heavy; do
  for w in 1 3; do
    for p in certify active; do
      settings+=("tpcc-$mix-$w-$p|$tpcc --mix $mix --warehouses $w --protocol $p")
    done
  done
done
run_settings "$runs" "" "" "${settings[@]}"
for i in $(seq "$runs"); do
  $bin bench executor --threads 1 --duration 3 --json "$out/executor-$i.json" >/dev/null
  $bin bench order --protocol active --nodes 3 --duration 5 --json "$out/order-$i.json" >/dev/null
  $bin bench order --protocol active --nodes 3 --duration 10 --kill-leader-every 3 \
    --json "$out/order-kills-$i.json" >/dev/null
done
python3 - "$out" "$runs" "${settings[@]}" <<'PY'
import json, statistics, sys
out, runs, settings = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
med = statistics.median
def load(name):
    return [json.load(open(f"{out}/{name}-{i}.json")) for i in range(1, runs + 1)]
print("| setting | command (`atomos bench ...`) | median tx/s | runs | abort rate | p50 / p99 (us) | invariant |")
print("| --- | --- | ---: | --- | ---: | --- | --- |")
medians = {}
for s in settings:
    name, args = s.split("|")
    rs = load(name)
    m = med(r["throughput_tps"] for r in rs)
    medians[name] = m
    runs_s = ", ".join(f"{r['throughput_tps']/1e3:.1f}K" for r in rs)
    ok = "ok" if all(r["invariant_ok"] for r in rs) else "VIOLATED"
    print(f"| {name} | `{args.replace(' --quiet', '')}` | {m:,.0f} | {runs_s} | "
          f"{med(r['abort_rate'] for r in rs):.3f} | {med(r['latency_us']['p50'] for r in rs):.0f} / "
          f"{med(r['latency_us']['p99'] for r in rs):.0f} | {ok} |")
print()
for mix in ["standard", "read-heavy"]:
    for w in [1, 3]:
        a, c = medians[f"tpcc-{mix}-{w}-active"], medians[f"tpcc-{mix}-{w}-certify"]
        print(f"- TPC-C {mix}, {w} warehouse(s): active / certify = {a / c:.2f}x")
ex = [json.load(open(f"{out}/executor-{i}.json")) for i in range(1, runs + 1)]
per_run = ", ".join("%.0fK" % (r["procedures_per_s"] / 1e3) for r in ex)
print()
print(f"- Executor alone (`bench executor --threads 1 --duration 3`): median "
      f"{med(r['procedures_per_s'] for r in ex):,.0f} procedures/s ({per_run}), with "
      f"{med(r['read_only_per_s'] for r in ex):,.0f} read-only procedures/s on one other thread")
for name, label in [("order", "failure-free, 5 s"), ("order-kills", "leader stopped every 3 s, 10 s")]:
    rs = [json.load(open(f"{out}/{name}-{i}.json")) for i in range(1, runs + 1)]
    print(f"- Order layer with the active store ({label}; `bench order --protocol active`): "
          f"median {med(r['ordered_per_s'] for r in rs):,.0f} transfers/s; revoked "
          f"{med(r['revoked_ratio'] for r in rs) * 100:.2f}% of optimistic deliveries "
          f"(runs: {', '.join('%.2f%%' % (r['revoked_ratio'] * 100) for r in rs)}); "
          f"{med(r['confirmed_ratio'] for r in rs) * 100:.2f}% of speculations confirmed")
PY
# HiperTM's figure 4: the bank at three contention levels, both protocols, one run per point.
mkdir -p "$out/sweep" docs/figures/active
$bin bench bank --nodes 3 --transport tcp --threads 4 --duration 4 --balance-k 10 --quiet \
  --sweep protocol=certify,active --sweep objects=500,2000,5000 --sweep read-ratio=0.1,0.5,0.9 \
  --json "$out/sweep/bank.json" >/dev/null
$bin report "$out"/sweep/*.json --out docs/figures/active
for f in "$out"/sweep/*.json; do
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['protocol'], r['objects'], r['read_ratio'], round(r['throughput_tps']), round(r['abort_rate'], 3))" "$f"
done
