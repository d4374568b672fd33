#!/usr/bin/env bash
# Soak: does the order layer's footprint stay flat over millions of commits from short-lived
# clients? Three `active` replicas in one process (TCP on loopback, logs on disk, snapshots as
# configured by default) order bank transfers for SECONDS (default 240); each replica's clients
# are retired after 100 requests, so later requests come from new clients (about 200,000 over
# 20 million commits on the AMD EPYC). Every 10 s it samples the process's resident memory, the
# logs' size on disk, the replicas' latest snapshot, their client sessions and the delivered
# batches they remember, and says of each whether the last half stays within a tenth of the
# second quarter. Writes the samples to target/soak.json (SOAK_JSON to change) and prints them.
# Usage: scripts/bench-soak.sh [SECONDS]
source "$(dirname "$0")/lib.sh"
seconds=${1:-240}
json=${SOAK_JSON:-target/soak.json}
$bin bench order --protocol active --duration "$seconds" --client-requests 100 \
  --sample-every 10 --json "$json" | tail -2
printf '%-6s %-10s %-8s %-8s %-12s %-9s %s\n' at_s ordered rss_mib wal_mib snapshot_kib sessions batches
python3 - "$json" <<'PY'
import json, sys
for s in json.load(open(sys.argv[1]))["samples"]:
    print(f"{s['at_s']:<6.0f} {s['ordered']:<10} {s['rss_bytes'] >> 20:<8} {s['wal_bytes'] >> 20:<8} "
          f"{s['snapshot_bytes'] >> 10:<12} {s['sessions']:<9} {s['batches']}")
PY
