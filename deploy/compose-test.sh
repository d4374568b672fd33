#!/usr/bin/env bash
# Builds the image, starts the compose cluster (3 certify replicas, 2 transfer threads each),
# kills one container (kill -9) while the bank runs, checks that the other two go on with
# every audit finding the money the bank started with, starts it again from its volume, and
# checks that it audits the same.
set -euo pipefail
cd "$(dirname "$0")"
project=atomos-ci-$$
source ./compose-lib.sh
cleanup() {
  compose logs --no-color > "$work/logs.txt" 2>&1 || true
  compose down -v --remove-orphans >/dev/null 2>&1 || true
  [ -z "${built:-}" ] || docker image rm -f "$built" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
./make-cluster.sh "$work" "$binary"
compose up -d

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
