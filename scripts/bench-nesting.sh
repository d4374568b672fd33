#!/usr/bin/env bash
# The nesting experiments (HyflowCPP thesis 6.3-6.4): bank and hash table at high contention,
# each update made of --inner operations composed flat, closed, checkpoint or open, on the local
# engine and on TFA. Runs each RUNS times (default 3) and prints a Markdown table of median
# throughput relative to flat. Usage: scripts/bench-nesting.sh [RUNS]
runs=${1:-3}
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
settings=(
  "bank-local|bank --objects 20 --read-ratio 0 --inner 5 --threads 2"
  "hashtable-local|hashtable --objects 20 --read-ratio 0.2 --inner 5 --threads 2"
  "bank-tfa|bank --protocol tfa --nodes 4 --objects 20 --read-ratio 0 --inner 5 --threads 2"
  "hashtable-tfa|hashtable --protocol tfa --nodes 4 --objects 20 --read-ratio 0.2 --inner 5 --threads 2"
)
models=(flat closed checkpoint open)
for s in "${settings[@]}"; do
  IFS='|' read -r name args <<<"$s"
  for i in $(seq "$runs"); do
    for m in "${models[@]}"; do
      # shellcheck disable=SC2086
      $bin bench $args --nesting "$m" --duration 3 --quiet --json "$out/$name-$m-$i.json" >/dev/null
    done
  done
done
python3 - "$out" "$runs" "${settings[@]}" <<'PY'
import json, statistics, sys
out, runs, settings = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
models = ["flat", "closed", "checkpoint", "open"]
print("| setting | command (`atomos bench ... --nesting M`) | " + " | ".join(f"{m} tx/s (vs flat)" for m in models) + " | aborts per commit (flat / closed / checkpoint / open) |")
print("| --- | --- | " + " | ".join("---:" for _ in models) + " | --- |")
for s in settings:
    name, args = s.split("|")
    med, ab = {}, {}
    for m in models:
        rs = [json.load(open(f"{out}/{name}-{m}-{i}.json")) for i in range(1, runs + 1)]
        assert all(r["invariant_ok"] for r in rs), (name, m)
        med[m] = statistics.median(r["throughput_tps"] for r in rs)
        ab[m] = statistics.median(r["aborted"] / max(r["committed"], 1) for r in rs)
    cells = " | ".join(f"{med[m]:,.0f} ({med[m]/med['flat'] - 1:+.0%})" if m != "flat" else f"{med[m]:,.0f}" for m in models)
    print(f"| {name} | `{args}` | {cells} | " + " / ".join(f"{ab[m]:.2f}" for m in models) + " |")
PY
