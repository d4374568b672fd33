#!/usr/bin/env bash
# Runs the benchmark targets of the local engine RUNS times each (default 3, 5 s per run) and
# prints a Markdown table of medians for docs/BENCHMARKS.md. Usage: scripts/bench-targets.sh [RUNS]
runs=${1:-3}
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"

targets=(
  "bank-transfers|bank --objects 1024 --read-ratio 0|3000000"
  "bank-balance-all|bank --objects 1024 --read-ratio 0.2|900000"
  "hashtable|hashtable --objects 4096 --read-ratio 0.8|6000000"
  "skiplist|skiplist --objects 4096 --read-ratio 0.8|2000000"
  "linkedlist|linkedlist --objects 256 --read-ratio 0.8|1000000"
  "bst|bst --objects 4096 --read-ratio 0.8|2500000"
  "bank-read-only|bank --objects 1024 --read-ratio 1|"
)
run_settings "$runs" "" "--threads 2 --duration 5 --quiet" "${targets[@]}"
for i in $(seq "$runs"); do
  $bin bench footprint --objects 1000000 --json "$out/footprint-$i.json" >/dev/null
done

python3 - "$out" "$runs" "${targets[@]}" <<'PY'
import json, statistics, sys
out, runs, targets = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def load(name):
    return [json.load(open(f"{out}/{name}-{i}.json")) for i in range(1, runs + 1)]
print("| benchmark | command (`atomos bench ...`, `--threads 2 --duration 5`) | median tx/s | runs | target | abort rate | p50 / p99 latency (us) | read-only aborts | invariant |")
print("| --- | --- | ---: | --- | ---: | ---: | --- | ---: | --- |")
for t in targets:
    name, args, target = t.split("|")
    rs = load(name)
    med = statistics.median(r["throughput_tps"] for r in rs)
    runs_s = ", ".join(f"{r['throughput_tps']/1e6:.2f}M" for r in rs)
    tgt = f"{int(target):,}" + (" met" if med >= int(target) else " **not met**") if target else "-"
    ro_aborts = sum(r["aborted"] for r in rs) if "read-ratio 1" in args else "-"
    print(f"| {name} | `{args}` | {med:,.0f} | {runs_s} | {tgt} | "
          f"{statistics.median(r['abort_rate'] for r in rs):.5f} | "
          f"{statistics.median(r['latency_us']['p50'] for r in rs):.2f} / {statistics.median(r['latency_us']['p99'] for r in rs):.2f} | "
          f"{ro_aborts} | {'ok' if all(r['invariant_ok'] for r in rs) else 'VIOLATED'} |")
fp = load("footprint")
print()
print(f"Footprint (`atomos bench footprint --objects 1000000`): resident memory after creating one million "
      f"16-byte objects, median {statistics.median(r['rss_after_mb'] for r in fp):.1f} MiB "
      f"({statistics.median(r['bytes_per_object'] for r in fp):.0f} bytes per object; target: under 250 MB).")
PY
