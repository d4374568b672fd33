#!/usr/bin/env bash
# Writes the configuration of a 3-replica `certify` cluster on the compose network
# (deploy/compose.yaml): a secret, a key pair per member, node-N.toml with every member's
# address and public key, and a bank load of 2 threads per node.
# Usage: deploy/make-cluster.sh DIR ATOMOS_BINARY
set -euo pipefail
dir=$1
atomos=$2
mkdir -p "$dir"
secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
peers=""
for n in 1 2 3; do
  rm -f "$dir/node-$n.key"
  key=$("$atomos" keygen --out "$dir/node-$n.key" --member "$n" | sed -n 's/^public key: //p')
  peers+=$'\n'"[[peers]]"$'\n'"id = $n"$'\n'"address = \"172.28.5.1$n:7401\""$'\n'"public_key = \"$key\""$'\n'
done
for n in 1 2 3; do
  cat > "$dir/node-$n.toml" <<TOML
cluster = "compose"
node_id = $n
listen = "172.28.5.1$n:7401"
data_dir = "/data"
secret = "$secret"
key_file = "/etc/atomos/node.key"
protocol = "certify"
metrics = "0.0.0.0:7501"
bank_load_threads = 2
$peers
TOML
  chmod 600 "$dir/node-$n.toml"
done
echo "wrote $dir/node-{1,2,3}.toml and their keys"
