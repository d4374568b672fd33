#!/usr/bin/env bash
# Runs `atomos bench net` RUNS times (default 5, 6 s each) and prints a Markdown table of medians
# for docs/BENCHMARKS.md. Usage: scripts/bench-net.sh [RUNS]
runs=${1:-5}
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
for i in $(seq "$runs"); do
  $bin bench net --duration 6 --json "$out/net-$i.json" >/dev/null
done
python3 - "$out" "$runs" <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
rs = [json.load(open(f"{out}/net-{i}.json")) for i in range(1, runs + 1)]
def row(key, label, target, fmt="{:.1f}"):
    vals = [r[key] for r in rs]
    m = statistics.median(vals)
    print(f"| {label} | {fmt.format(m)} | {', '.join(fmt.format(v) for v in vals)} | {target} |")
print("| measure | median | runs | target |")
print("| --- | ---: | --- | --- |")
row("blocking_tcp_rtt_p50_us", "blocking-socket ping-pong p50 (us)", "-")
row("blocking_tcp_rtt_p99_us", "blocking-socket ping-pong p99 (us)", "-")
row("raw_tcp_rtt_p50_us", "tokio TCP ping-pong p50 (us)", "-")
row("raw_tcp_rtt_p99_us", "tokio TCP ping-pong p99 (us)", "-")
row("rtt_p50_us", "request/response p50 (us)", "within 3x blocking-socket p50")
row("rtt_p99_us", "request/response p99 (us)", "-")
ratios = sorted(r["rtt_over_blocking"] for r in rs)
print(f"| request/response p50 / blocking-socket p50 | {statistics.median(ratios):.2f}x | {', '.join(f'{x:.2f}' for x in ratios)} (sorted) | at most 3x |")
row("oneway_msgs_per_s", "one-way 64-byte messages per second", "at least 500,000", "{:,.0f}")
PY
