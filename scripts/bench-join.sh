#!/usr/bin/env bash
# A learner joins a 3-replica `certify` cluster whose store holds MIB MiB (default 1024) while
# the bank load runs unpaced (2 threads per node): node 4, with an empty disk, is added with
# `atomos member add` and is caught up once it has applied what the cluster had committed when
# it was added. Reports per run: the store's snapshot size; the join's time (from `member add`
# until caught up) and the store's size over it; the stream's time (from the learner's first
# byte of a snapshot stream to its last, sampled every 0.1 s from its metrics) and its rate; the
# transfers the cluster acknowledged per second in the 10 s before and during the join; the
# resident memory of the leader before the add (VmRSS) and the peak resident memory (VmHWM) of
# the leader (the sender) and of the learner; how many snapshots the learner installed; and,
# right after the join with the load still running, what the disk takes: MIB MiB (at most 1 GiB)
# written to the data directory and flushed (dd), in MiB/s, the bound a learner's install
# writes under.
# Usage: scripts/bench-join.sh [MIB] [RUNS]; ATOMOS_BANK_LOAD_PACE_MS=N paces each load thread
# (N ms between transfers; 0 by default: unpaced), to measure the join on a quiet cluster.
source "$(dirname "$0")/lib.sh"
mib=${1:-1024}
runs=${2:-1}

# The JSON of `atomos status` asked with the cluster's client.
status() { $bin status --json --wait 3 --client "$dir/client.toml" 2>/dev/null || true; }
# Field `path` ("cluster.leader.0", "member.4.applied") of a status document on stdin.
pick() {
  python3 -c '
import json, sys
doc = json.load(sys.stdin)
path = sys.argv[1].split(".")
if path[0] == "member":
    node = next((m for m in doc["members"] if m["id"] == int(path[1])), None)
    status = (node or {}).get("status", {}).get("Ok") or {}
    print((status.get("replica") or {}).get(path[2], ""))
else:
    v = doc["cluster"]
    for p in path[1:]:
        v = v[int(p)] if isinstance(v, list) else v.get(p)
        if v is None: break
    print("" if v is None else v)' "$1"
}
# Transfers acknowledged so far, summed over every run on every node (each node's last audit).
acked() {
  local total=0 n t
  for n in 1 2 3 4; do
    t=$(grep 'bank audit' "$dir/node-$n.log" 2>/dev/null | tail -1 | sed -n 's/.* transfers=\([0-9]*\).*/\1/p')
    total=$((total + ${t:-0}))
  done
  echo "$total"
}
peak_rss_mib() { awk '/VmHWM/ {print int($2 / 1024)}' "/proc/$1/status" 2>/dev/null || echo "?"; }
rss_mib() { awk '/VmRSS/ {print int($2 / 1024)}' "/proc/$1/status" 2>/dev/null || echo "?"; }

# A metric of node N (empty if it does not answer).
metric() { { curl -s -m 1 "http://127.0.0.1:$((base + 99 + $1))/metrics" || true; } | awk -v m="$2" '$1 ~ "^"m && !v {v = $2} END {print v}'; }

printf '%-4s %-10s %-7s %-11s %-9s %-13s %-12s %-12s %-9s %-14s %-14s %-16s %-9s %s\n' run store_MiB join_s join_MiB/s stream_s stream_MiB/s tx/s_before tx/s_during ratio leader_rss_MiB leader_peak_MiB learner_peak_MiB installs disk_MiB/s
for run in $(seq "$runs"); do
  dir=$out/run-$run
  base=$((20000 + RANDOM % 10000))
  ATOMOS_BANK_LOAD_BALLAST_MIB=$mib ATOMOS_BANK_LOAD_PACE_MS=${ATOMOS_BANK_LOAD_PACE_MS:-0} ATOMOS_OPERATORS=client \
    ATOMOS_ORDER_FSYNC=${ATOMOS_ORDER_FSYNC:-never} \
    $bin cluster up --nodes 3 --protocol certify --bank-load 2 --base-port "$base" \
    --dir "$dir" > "$out/up-$run.txt" &
  up=$!
  trap 'kill $up 2>/dev/null || true; kill ${joiner:-} 2>/dev/null || true; rm -rf "$out"' EXIT
  until grep -q "ballast written" "$dir/node-1.log" 2>/dev/null; do sleep 1; done
  sleep 5
  a0=$(acked); sleep 10; a1=$(acked)
  before=$(( (a1 - a0) / 10 ))
  leader=$(status | pick cluster.leader.0)
  leader_pid=$(sed -n "s/^node $leader: pid \([0-9]*\).*/\1/p" "$out/up-$run.txt" | head -1)
  leader_rss=$(rss_mib "$leader_pid")
  # Node 4: node 1's configuration with its own id, key, address and an empty data directory.
  $bin keygen --member 4 --out "$dir/node-4.key" > "$dir/node-4.keygen"
  key=$(sed -n 's/^public key: //p' "$dir/node-4.keygen")
  sed -e "s/node_id = 1/node_id = 4/" \
    -e "s/^listen = \"127.0.0.1:$base\"/listen = \"127.0.0.1:$((base + 3))\"/" \
    -e "s/^metrics = \"127.0.0.1:$((base + 100))\"/metrics = \"127.0.0.1:$((base + 103))\"/" \
    -e "s/node-1.key/node-4.key/" -e "s#$dir/data/1#$dir/data/4#" "$dir/node-1.toml" \
    | { echo "order_join = true"; cat; } > "$dir/node-4.toml"
  chmod 600 "$dir/node-4.toml"
  ATOMOS_BANK_LOAD_PACE_MS=${ATOMOS_BANK_LOAD_PACE_MS:-0} ATOMOS_OPERATORS=client ATOMOS_ORDER_FSYNC=${ATOMOS_ORDER_FSYNC:-never} \
    $bin node --config "$dir/node-4.toml" 2> "$dir/node-4.log" &
  joiner=$!
  # Node 4's bytes of snapshot streams received so far, sampled until it stops.
  ( while kill -0 "$joiner" 2>/dev/null; do
      printf '%s %s\n' "$(date +%s.%N)" "$(metric 4 atomos_order_stream_in_bytes_total)"
      sleep 0.1
    done ) > "$dir/stream-samples.txt" 2>/dev/null &
  sleep 1
  started=$(date +%s.%N)
  a2=$(acked)
  # A leader change can drop the proposal: asked again until the membership lists node 4.
  limit=$((SECONDS + ${JOIN_LIMIT:-300}))
  until $bin member list --json --client "$dir/client.toml" 2>/dev/null | grep -q '"id": 4'; do
    $bin member add --id 4 --address "127.0.0.1:$((base + 3))" --public-key "$key" \
      --client "$dir/client.toml" --wait 10 > /dev/null 2>&1 || true
    [ $SECONDS -lt "$limit" ] || break
  done
  target=$(status | pick cluster.highest_commit)
  until applied=$(status | pick member.4.applied) && [ -n "$applied" ] && [ "$applied" -ge "${target:-1}" ]; do
    if ! kill -0 "$joiner" 2>/dev/null; then
      echo "node 4 stopped:" >&2; tail -5 "$dir/node-4.log" >&2; exit 1
    fi
    if [ $SECONDS -ge "$limit" ]; then
      terms=$(grep -h -c 'became leader' "$dir"/node-[123].log | paste -sd+ | bc)
      echo "$run: node 4 did not catch up in ${JOIN_LIMIT:-300} s ($terms elections in the cluster's logs)"
      kill "$joiner" "$up" 2>/dev/null || true
      wait "$up" 2>/dev/null || true
      continue 2
    fi
    sleep 0.2
  done
  ended=$(date +%s.%N)
  a3=$(acked)
  seconds=$(echo "$ended - $started" | bc -l)
  bytes=$(metric "$leader" atomos_order_snapshot_bytes)
  installs=$(metric 4 atomos_order_replica_snapshots_installed_total)
  probe=$(( mib < 1024 ? mib : 1024 ))
  disk=$( { dd if=/dev/zero of="$dir/disk-probe" bs=1M count="$probe" conv=fdatasync 2>&1 || true; } \
    | awk -v mib="$probe" '/copied/ { for (i = 1; i <= NF; i++) if ($i ~ /^s,?$/) s = $(i - 1); if (s > 0) printf "%.0f", mib / s }')
  rm -f "$dir/disk-probe"
  store=$(echo "${bytes:-0} / 1048576" | bc)
  during=$(echo "($a3 - $a2) / $seconds" | bc)
  # From the first sample holding a byte to the first holding them all.
  read -r stream_s stream_rate < <(awk 'NF == 2 && $2 > 0 { if (!s) s = $1; if ($2 > last) { last = $2; e = $1 } }
    END { if (s && e > s) printf "%.1f %.1f\n", e - s, last / 1048576 / (e - s); else print "? ?" }' "$dir/stream-samples.txt")
  printf '%-4s %-10s %-7.1f %-11.1f %-9s %-13s %-12s %-12s %-9.2f %-14s %-14s %-16s %-9s %s\n' "$run" "$store" "$seconds" \
    "$(echo "$store / $seconds" | bc -l)" "$stream_s" "$stream_rate" "$before" "$during" "$(echo "$during / ($before + 0.0001)" | bc -l)" \
    "$leader_rss" "$(peak_rss_mib "$leader_pid")" "$(peak_rss_mib "$joiner")" "${installs:-?}" "${disk:-?}"
  kill "$joiner" "$up" 2>/dev/null || true
  wait "$up" 2>/dev/null || true
  joiner=""
  # BENCH_KEEP=DIR keeps each run's node logs there.
  if [ -n "${BENCH_KEEP:-}" ]; then mkdir -p "$BENCH_KEEP/run-$run" && cp "$dir"/node-*.log "$dir/stream-samples.txt" "$BENCH_KEEP/run-$run/"; fi
done
