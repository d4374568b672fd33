#!/usr/bin/env bash
# Builds the image, starts the compose cluster (3 certify replicas, 2 transfer threads each),
# kills one container (kill -9) while the bank runs, checks that the other two go on with
# every audit finding the money the bank started with, starts it again from its volume, and
# checks that it audits the same.
set -euo pipefail
cd "$(dirname "$0")"
project=atomos-ci-$$
export ATOMOS_IMAGE=atomos:ci-$$
./build-image.sh "$ATOMOS_IMAGE"
work=$(mktemp -d)
export ATOMOS_CLUSTER_DIR=$work
compose() { docker-compose -p "$project" -f compose.yaml "$@"; }
cleanup() {
  compose logs --no-color > "$work/logs.txt" 2>&1 || true
  compose down -v --remove-orphans >/dev/null 2>&1 || true
  docker image rm -f "$ATOMOS_IMAGE" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
binary=${ATOMOS_IMAGE_TARGET_DIR:-../target/image}/x86_64-unknown-linux-gnu/release/atomos
./make-cluster.sh "$work" "$binary"
compose up -d

# Successful bank audits `node` logged so far ("bank audit ... total=T expected=E").
audit_lines() { compose logs --no-color "$@" 2>/dev/null | grep 'bank audit' | grep -v 'audit failed' || true; }
audits() { audit_lines "$1" | wc -l; }
# Waits until `node` has logged `more` audits more than it had.
wait_audits() {
  local node=$1 more=$2 start deadline
  start=$(audits "$node")
  deadline=$((SECONDS + 90))
  until [ "$(audits "$node")" -ge $((start + more)) ]; do
    if [ $SECONDS -ge $deadline ]; then
      echo "$node: no new audits in 90 s"; compose logs --no-color --tail 30 "$node"; exit 1
    fi
    sleep 1
  done
}
# Every audit found the money the bank started with.
check_totals() {
  local bad
  bad=$(audit_lines | awk '{t=""; e=""; for (i=1;i<=NF;i++) { if ($i ~ /^total=/) t=substr($i,7); if ($i ~ /^expected=/) e=substr($i,10) } if (t == "" || t != e) print }')
  if [ -n "$bad" ]; then echo "audits that found another total:"; echo "$bad" | head; exit 1; fi
  echo "   $(audit_lines | wc -l) audits so far, every one found the bank's total"
}
for n in node1 node2 node3; do wait_audits "$n" 3; done
check_totals
echo "== all three audit; killing node2 (SIGKILL)"
compose kill -s SIGKILL node2
for n in node1 node3; do wait_audits "$n" 5; done
check_totals
echo "== node1 and node3 go on; starting node2 again from its volume"
compose start node2
wait_audits node2 3
check_totals
echo "== node2 is back and audits the same: OK"
