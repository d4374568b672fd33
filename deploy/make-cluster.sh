#!/usr/bin/env bash
# Writes the configuration of a 3-replica `certify` cluster on the compose network
# (deploy/compose.yaml): a secret, a key pair per member, node-N.toml with every member's
# address and public key, and a bank load of 2 threads per node; an operator client (`ops`,
# listed in `operators`: ops.toml and ops.key, for `atomos status` and `atomos member` from the
# host); and a spare member, node 4 at 172.28.5.14 with `order_join = true`, for a replacement.
# Usage: deploy/make-cluster.sh DIR ATOMOS_BINARY
set -euo pipefail
dir=$1
atomos=$2
mkdir -p "$dir"
secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
peers=""
members=""
for n in 1 2 3 4; do
  rm -f "$dir/node-$n.key"
  key=$("$atomos" keygen --out "$dir/node-$n.key" --member "$n" | sed -n 's/^public key: //p')
  echo "$key" > "$dir/node-$n.pub"
  [ "$n" = 4 ] && break
  peers+=$'\n'"[[peers]]"$'\n'"id = $n"$'\n'"address = \"172.28.5.1$n:7401\""$'\n'"public_key = \"$key\""$'\n'
  members+=$'\n'"[[members]]"$'\n'"id = $n"$'\n'"address = \"172.28.5.1$n:7401\""$'\n'"public_key = \"$key\""$'\n'
done
rm -f "$dir/ops.key"
ops=$("$atomos" keygen --out "$dir/ops.key" --client ops | sed -n 's/^public key: //p')
for n in 1 2 3 4; do
  join=""
  [ "$n" = 4 ] && join="order_join = true"
  cat > "$dir/node-$n.toml" <<TOML
$join
cluster = "compose"
node_id = $n
listen = "172.28.5.1$n:7401"
data_dir = "/data"
secret = "$secret"
key_file = "/etc/atomos/node.key"
protocol = "certify"
metrics = "0.0.0.0:7501"
bank_load_threads = 2
operators = ["ops"]
$peers
[[clients]]
name = "ops"
public_key = "$ops"
TOML
  chmod 600 "$dir/node-$n.toml"
done
cat > "$dir/ops.toml" <<TOML
cluster = "compose"
secret = "$secret"
key_file = "ops.key"
$members
TOML
chmod 600 "$dir/ops.toml"
echo "wrote $dir/node-{1,2,3,4}.toml, their keys, and ops.toml"
