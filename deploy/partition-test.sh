#!/usr/bin/env bash
# Partitions and a replacement between real hosts: the compose cluster (3 `certify` replicas as
# containers on a private network, 2 transfer threads each) under its bank load.
#  1. The leader is cut off the network for 10 s: the two others elect a leader and go on
#     committing, the cut-off node commits nothing (its transactions fail or stay unknown),
#     and once reconnected it commits again.
#  2. The same for a follower.
#  3. A follower is killed (SIGKILL) and replaced by a new host with a new id and address
#     (node 4, an empty disk, `order_join = true`): `atomos member add`, then `member replace`,
#     from the host with an operator's key.
# Throughout, every audit on every node finds the bank's total, and at the end the replaced
# node's acknowledged transfers are all counted in the new member's state.
# ATOMOS_IMAGE names an image built already; otherwise one is built here and removed after.
set -euo pipefail
cd "$(dirname "$0")"
project=atomos-part-$$
source ./compose-lib.sh
spare=${project}_node4
cleanup() {
  docker rm -f -v "$spare" >/dev/null 2>&1 || true
  compose down -v --remove-orphans >/dev/null 2>&1 || true
  [ -z "${built:-}" ] || docker image rm -f "$built" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
./make-cluster.sh "$work" "$binary"
compose up -d
net=${project}_cluster
container() { compose ps -q "$1"; }
# The leader a majority follows, as `atomos status` from the host says (empty if none).
# (`status --json` prints the summary first, its keys sorted: can_commit, then leader.)
leader() {
  { "$binary" status --json --wait 3 --client "$work/ops.toml" 2>/dev/null || true; } |
    tr -d ' \n' | sed -n 's/^{"cluster":{[^}]*"can_commit":true[^}]*"leader":\[\([0-9]*\),.*/\1/p'
}
wait_leader() {
  local l deadline=$((SECONDS + 60))
  until l=$(leader) && [ -n "$l" ]; do
    if [ $SECONDS -ge $deadline ]; then echo "no leader a majority follows" >&2; exit 1; fi
    sleep 1
  done
  echo "$l"
}
# `atomos member ARGS` as the operator, retried while the cluster asks to wait (exit 1); a
# refusal after a first attempt that says the change was made (its answer lost) ends it too.
member() {
  local deadline=$((SECONDS + 90)) out attempts=0
  until out=$("$binary" member "$@" --client "$work/ops.toml" 2>&1); do
    attempts=$((attempts + 1))
    if [ $attempts -gt 1 ] && echo "$out" | grep -q 'member already\|is not a learner\|is not a voter\|is not a member'; then
      break
    fi
    if [ $SECONDS -ge $deadline ]; then echo "member $*: $out" >&2; exit 1; fi
    sleep 1
  done
  echo "   member $*: $out"
}
# Cuts `node` off the network for 10 s while the others commit, then reconnects it.
cut_off() {
  local node=$1 n=${1#node} others=() before=() cut_acked o i
  for o in node1 node2 node3; do [ "$o" = "$node" ] || others+=("$o"); done
  docker network disconnect "$net" "$(container "$node")"
  # What was acknowledged before the cut shows in the audits of the next two seconds.
  sleep 2
  cut_acked=$(acked "$node")
  for o in "${others[@]}"; do before+=("$(acked "$o")"); done
  sleep 8
  for i in 0 1; do
    if [ "$(acked "${others[$i]}")" -le "${before[$i]}" ]; then
      echo "${others[$i]} committed nothing while $node was cut off" >&2; exit 1
    fi
  done
  # Transfers under way at the cut may end acknowledged; none after (2 threads).
  if [ "$(acked "$node")" -gt $((cut_acked + 2)) ]; then
    echo "$node, cut off, went on committing: $cut_acked, then $(acked "$node")"; exit 1
  fi
  echo "   while $node was cut off: ${others[0]} and ${others[1]} committed, $node did not ($(acked "$node") acknowledged)"
  docker network connect --ip "172.28.5.1$n" "$net" "$(container "$node")"
  wait_acked "$node" "$(acked "$node")"
  echo "   $node reconnected and commits again"
}

for n in node1 node2 node3; do wait_acked "$n" 0; done
check_totals
l=$(wait_leader)
echo "== cutting off the leader (node$l) for 10 s"
cut_off "node$l"
check_totals
l=$(wait_leader)
f=$(( l % 3 + 1 ))
echo "== cutting off a follower (node$f) for 10 s"
cut_off "node$f"
check_totals

l=$(wait_leader)
victim=$(( l % 3 + 1 ))
echo "== node$victim dies (SIGKILL); node 4, a new host on a new address, replaces it"
docker run -d --name "$spare" --network "$net" --ip 172.28.5.14 \
  -v "$work/node-4.toml:/etc/atomos/node.toml:ro" -v "$work/node-4.key:/etc/atomos/node.key:ro" \
  "$ATOMOS_IMAGE" >/dev/null
compose kill -s SIGKILL "node$victim"
member add --id 4 --address 172.28.5.14:7401 --public-key "$(cat "$work/node-4.pub")"
member replace --remove "$victim" --add 4
wait_acked "$spare" 0
for o in node1 node2 node3; do [ "$o" = "node$victim" ] || wait_audits "$o" 2; done
check_totals
check_totals "$spare"

# Nothing the killed node saw acknowledged is lost: its run's count in node 4's state is at
# least what its last audit reported.
last=$(audit_lines "node$victim" | tail -1)
run=$(echo "$last" | field run)
acked_then=$(echo "$last" | field transfers)
wait_audits "$spare" 2
counted=$(audit_lines "$spare" | tail -1 | field counted | tr ',' '\n' | sed -n "s/^$run://p")
if [ -z "$counted" ] || [ "$counted" -lt "$acked_then" ]; then
  echo "node$victim's run $run saw $acked_then transfers acknowledged; node 4 counts ${counted:-none}"
  exit 1
fi
echo "   node$victim's run saw $acked_then transfers acknowledged; node 4 counts $counted"
"$binary" member list --client "$work/ops.toml"
echo "== partitions and a replacement: OK"
