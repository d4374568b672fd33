# What the compose tests share (sourced): the compose project, the bank's audits as the nodes
# log them ("bank audit ... total=T expected=E run=R transfers=N counted=R:N,..."), and waits.
# The sourcing script sets `project` first.

# The image: ATOMOS_IMAGE names one built already (by deploy/build-image.sh); otherwise one is
# built here, and `built` names it for the script to remove at the end.
if [ -z "${ATOMOS_IMAGE:-}" ]; then
  export ATOMOS_IMAGE=atomos:$project
  ./build-image.sh "$ATOMOS_IMAGE"
  built=$ATOMOS_IMAGE
fi
# The cluster's configuration, and the static binary the image holds (for `atomos` on the host).
work=$(mktemp -d)
export ATOMOS_CLUSTER_DIR=$work
binary=${ATOMOS_IMAGE_TARGET_DIR:-../target/image}/x86_64-unknown-linux-gnu/release/atomos

compose() { docker-compose -p "$project" -f compose.yaml "$@"; }
# The log of `node` (node1..node3 from compose, a container name otherwise), or of all.
node_logs() {
  if [ $# -eq 0 ] || [[ $1 == node[123] ]]; then
    compose logs --no-color "$@" 2>/dev/null
  else
    docker logs "$1" 2>&1
  fi
}
# Successful bank audits `node` logged so far.
audit_lines() { node_logs "$@" | grep 'bank audit' | grep -v 'audit failed' || true; }
audits() { audit_lines "$1" | wc -l; }
# The value of field `name` in an audit line.
field() { sed -n "s/.* $1=\"\{0,1\}\([^\" ]*\).*/\1/p"; }
# The transfers `node`'s current run saw acknowledged, as its last audit says (0 before one).
acked() { audit_lines "$1" | tail -1 | field transfers | grep . || echo 0; }
# Waits until `node` has logged `more` audits more than it had.
wait_audits() {
  local node=$1 more=$2 start deadline
  start=$(audits "$node")
  deadline=$((SECONDS + 90))
  until [ "$(audits "$node")" -ge $((start + more)) ]; do
    if [ $SECONDS -ge $deadline ]; then
      echo "$node: no new audits in 90 s"; node_logs "$node" | tail -30; exit 1
    fi
    sleep 1
  done
}
# Waits until `node`'s run saw more than `than` transfers acknowledged.
wait_acked() {
  local node=$1 than=$2 deadline=$((SECONDS + 90))
  until [ "$(acked "$node")" -gt "$than" ]; do
    if [ $SECONDS -ge $deadline ]; then
      echo "$node: no transfer acknowledged past $than in 90 s"; node_logs "$node" | tail -30; exit 1
    fi
    sleep 1
  done
}
# Every audit (of `nodes`, all by default) found the money the bank started with.
check_totals() {
  local bad
  bad=$(audit_lines "$@" | awk '{t=""; e=""; for (i=1;i<=NF;i++) { if ($i ~ /^total=/) t=substr($i,7); if ($i ~ /^expected=/) e=substr($i,10) } if (t == "" || t != e) print }')
  if [ -n "$bad" ]; then echo "audits that found another total:"; echo "$bad" | head; exit 1; fi
  echo "   $(audit_lines "$@" | wc -l) audits so far, every one found the bank's total"
}
