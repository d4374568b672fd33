#!/usr/bin/env bash
# Runs the benchmark targets of the local engine RUNS times each (default 3, 5 s per run) and
# prints a Markdown table of medians for docs/BENCHMARKS.md. With TINYSTM set to a TinySTM
# 1.0.5 checkout built with `make` and `make -C test`, each run of a workload is followed by
# TinySTM's own program for it with the same parameters (2 threads, 5 s), and the table gains
# TinySTM's median and the median of each run's ratio to TinySTM's run after it. With a C
# compiler at hand, `scripts/core-to-core.c` runs before and after each run of a workload (and
# TinySTM's after it) and the table gains its round trips: this machine switches between two
# speeds (docs/BENCHMARKS.md, "Two speeds"), and a pair whose two probes differ crossed a switch.
# Usage: [TINYSTM=DIR] scripts/bench-targets.sh [RUNS]
runs=${1:-3}
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"

# name|atomos bench arguments|target tx/s|TinySTM's program and arguments (under test/)
targets=(
  "bank-transfers|bank --objects 1024 --read-ratio 0|3000000|bank/bank -a 1024 -r 0 -w 0"
  "bank-balance-all|bank --objects 1024 --read-ratio 0.2|900000|bank/bank -a 1024 -r 20 -w 0"
  "hashtable|hashtable --objects 4096 --read-ratio 0.8|6000000|intset/intset-hs -i 4096 -r 8192 -u 20"
  "skiplist|skiplist --objects 4096 --read-ratio 0.8|2000000|intset/intset-sl -i 4096 -r 8192 -u 20"
  "linkedlist|linkedlist --objects 256 --read-ratio 0.8|1000000|intset/intset-ll -i 256 -r 512 -u 20"
  "bst|bst --objects 4096 --read-ratio 0.8|2500000|"
  "rbtree|rbtree --objects 4096 --read-ratio 0.8||intset/intset-rb -i 4096 -r 8192 -u 20"
  "bank-read-only|bank --objects 1024 --read-ratio 1||"
)
probe=""
if command -v cc >/dev/null && cc -O2 -pthread -o "$out/core-to-core" scripts/core-to-core.c; then
  probe="$out/core-to-core"
fi
# probe_into FILE: the core-to-core round trip in ns into FILE (nothing without a probe).
probe_into() {
  if [ -n "$probe" ]; then
    ("$probe" || true) | sed -n 's/.*: \([0-9.]*\) ns$/\1/p' >"$1"
  fi
}
for i in $(seq "$runs"); do
  for t in "${targets[@]}"; do
    IFS='|' read -r name args _ tiny <<<"$t"
    probe_into "$out/probe-$name-$i-before.txt"
    # shellcheck disable=SC2086
    $bin bench $args --threads 2 --duration 5 --quiet --json "$out/$name-$i.json" >/dev/null
    if [ -n "${TINYSTM:-}" ] && [ -n "$tiny" ]; then
      # shellcheck disable=SC2086
      ("$TINYSTM"/test/$tiny -n 2 -d 5000 || true) |
        sed -n 's/^#txs *: [0-9]* (\([0-9.]*\) \/ s)/\1/p' >"$out/tinystm-$name-$i.txt"
    fi
    probe_into "$out/probe-$name-$i-after.txt"
  done
done
for i in $(seq "$runs"); do
  $bin bench footprint --objects 1000000 --json "$out/footprint-$i.json" >/dev/null
done

python3 - "$out" "$runs" "${targets[@]}" <<'PY'
import json, statistics, sys
out, runs, targets = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def load(name):
    return [json.load(open(f"{out}/{name}-{i}.json")) for i in range(1, runs + 1)]
import os
def tinystm(name):
    files = [f"{out}/tinystm-{name}-{i}.txt" for i in range(1, runs + 1)]
    values = [open(f).read().split() for f in files if os.path.exists(f)]
    values = [float(v[0]) for v in values if v]
    # Only when every run gave a figure (a failed TinySTM run prints "-").
    return values if len(values) == len(files) else None
def probe(path):
    value = open(path).read().strip() if os.path.exists(path) else ""
    return f"{float(value):.0f}" if value else "?"
# Round trips of the two spells on this machine: 52-63 ns and 318-360 ns (BENCHMARKS.md).
FAST_NS, SLOW_NS = 120, 200
def spell_ratios(name, pairs):
    """The median ratio of the pairs whose probes before and after both read fast, and of
    those that both read slow (a pair between them crossed a switch)."""
    def spell(i):
        try:
            ns = [float(open(f"{out}/probe-{name}-{i}-{w}.txt").read()) for w in ("before", "after")]
        except (OSError, ValueError):
            return None
        return "fast" if max(ns) < FAST_NS else "slow" if min(ns) > SLOW_NS else None
    if not pairs:
        return "-"
    kinds = [spell(i) for i in range(1, len(pairs) + 1)]
    def med(kind):
        sel = [p for p, k in zip(pairs, kinds) if k == kind]
        return f"{statistics.median(sel):.2f}x ({len(sel)})" if sel else "- (0)"
    return f"{med('fast')} / {med('slow')}"
def probes(name):
    if not os.path.exists(f"{out}/probe-{name}-1-before.txt"):
        return "-"
    return ", ".join(f"{probe(f'{out}/probe-{name}-{i}-before.txt')}/{probe(f'{out}/probe-{name}-{i}-after.txt')}"
                     for i in range(1, runs + 1))
print("| benchmark | command (`atomos bench ...`, `--threads 2 --duration 5`) | median tx/s | runs | target | TinySTM median tx/s | ratio to TinySTM, median of the runs' ratios (target 0.8) | abort rate | p50 / p99 latency (us) | read-only aborts | invariant | core-to-core round trip before/after each run (ns) | ratio in pairs that stayed in the fast / slow spell |")
print("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | --- | --- | --- |")
for t in targets:
    name, args, target, _ = t.split("|")
    rs = load(name)
    med = statistics.median(r["throughput_tps"] for r in rs)
    runs_s = ", ".join(f"{r['throughput_tps']/1e6:.2f}M" for r in rs)
    tgt = f"{int(target):,}" + (" met" if med >= int(target) else " **not met**") if target else "-"
    ro_aborts = sum(r["aborted"] for r in rs) if "read-ratio 1" in args else "-"
    tiny = tinystm(name)
    tiny_s = f"{statistics.median(tiny):,.0f}" if tiny else "-"
    # Each of our runs is followed at once by TinySTM's: the median of the runs' own ratios
    # holds up when the machine changes speed between runs (it does, by up to 2x).
    pairs = [r["throughput_tps"] / t for r, t in zip(rs, tiny)] if tiny else []
    ratio = (f"{statistics.median(pairs):.2f}x ({', '.join(f'{p:.2f}' for p in pairs)})"
             if tiny else "-")
    print(f"| {name} | `{args}` | {med:,.0f} | {runs_s} | {tgt} | {tiny_s} | {ratio} | "
          f"{statistics.median(r['abort_rate'] for r in rs):.5f} | "
          f"{statistics.median(r['latency_us']['p50'] for r in rs):.2f} / {statistics.median(r['latency_us']['p99'] for r in rs):.2f} | "
          f"{ro_aborts} | {'ok' if all(r['invariant_ok'] for r in rs) else 'VIOLATED'} | {probes(name)} | "
          f"{spell_ratios(name, pairs)} |")
fp = load("footprint")
print()
print(f"Footprint (`atomos bench footprint --objects 1000000`): resident memory after creating one million "
      f"16-byte objects, median {statistics.median(r['rss_after_mb'] for r in fp):.1f} MiB "
      f"({statistics.median(r['bytes_per_object'] for r in fp):.0f} bytes per object; target: under 250 MB).")
PY
