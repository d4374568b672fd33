#!/usr/bin/env bash
# How long `atomos status --json` takes to answer on a healthy 5-replica `certify` cluster
# (`atomos cluster up --nodes 5`, the bank load running paced, 1 thread per node): once status
# exits 0 (every member answered and a majority follows one leader), it is asked CALLS times
# in a row (default 50), each a new process as an operator runs it. Reports the median, the
# 90th percentile and the slowest, in milliseconds, wall time of the whole command.
# Usage: scripts/bench-status.sh [CALLS] [RUNS]
source "$(dirname "$0")/lib.sh"
calls=${1:-50}
runs=${2:-1}

printf '%-4s %-6s %-10s %-10s %s\n' run calls median_ms p90_ms max_ms
for run in $(seq "$runs"); do
  dir=$out/run-$run
  base=$((20000 + RANDOM % 10000))
  ATOMOS_OPERATORS=client ATOMOS_BANK_LOAD_PACE_MS=${ATOMOS_BANK_LOAD_PACE_MS:-10} \
    $bin cluster up --nodes 5 --protocol certify --bank-load 1 --base-port "$base" \
    --dir "$dir" > "$out/up-$run.txt" &
  up=$!
  trap 'kill $up 2>/dev/null || true; rm -rf "$out"' EXIT
  limit=$((SECONDS + 120))
  until [ -f "$dir/client.toml" ] && $bin status --client "$dir/client.toml" > /dev/null 2>&1; do
    if [ $SECONDS -ge $limit ]; then echo "$run: the cluster never became healthy" >&2; exit 1; fi
    sleep 0.5
  done
  sleep 2
  : > "$out/times-$run.txt"
  for _ in $(seq "$calls"); do
    t0=$(date +%s%N)
    $bin status --json --client "$dir/client.toml" > /dev/null 2>&1 || echo "status failed" >&2
    t1=$(date +%s%N)
    echo $(( (t1 - t0) / 1000 )) >> "$out/times-$run.txt"
  done
  sort -n "$out/times-$run.txt" | awk -v run="$run" '{ t[NR] = $1 }
    END { printf "%-4s %-6s %-10.1f %-10.1f %.1f\n", run, NR, t[int((NR + 1) / 2)] / 1000,
          t[int(NR * 0.9 + 0.5)] / 1000, t[NR] / 1000 }'
  kill "$up" 2>/dev/null || true
  wait "$up" 2>/dev/null || true
done
