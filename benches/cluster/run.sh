#!/usr/bin/env bash
# Complete payments a second through the API of a cluster, and the time its failover takes (issue 22): two
# `caisse serve` nodes on loopback share one PostgreSQL database, `caisse-load` sends the arrivals to the nodes
# in turn and verifies every `payment.succeeded` webhook.
#
#   benches/cluster/run.sh RATE DURATION_S [KILL_AT_S]
#
# With KILL_AT_S, the second node is killed with SIGKILL that many seconds into the load. The load tool leaves
# a node that does not answer out for a second at a time, as a load balancer's health check would, so what the
# run counts by second in `failures_by_second` is the failover itself: the killed node's merchants answer 503
# on the survivor until their leases end and it takes them over. Payments the killed node had accepted wait for
# its sandbox's notices, which died with it: their provider requests are sent again a minute after the takeover,
# after the run's grace, so the report counts them as lost lives.
#
# Environment (defaults in brackets): CAISSE_BENCH_DATABASE_URL [postgres://postgres@127.0.0.1:5432/postgres]:
# a server where a database `caisse_cluster_bench` may be dropped and made again (give it fsync on: that is
# what the figures depend on); NODES [2]; MERCHANTS [1000]; CAISSE_BIN and CAISSE_LOAD_BIN [built with
# `cargo build --release` under ${CARGO_TARGET_DIR:-target}/release]. The nodes listen on 18081 and 18082.
set -euo pipefail

rate=${1:?RATE}
duration=${2:?DURATION_S}
kill_at=${3:-}
nodes=${NODES:-2}
merchants=${MERCHANTS:-1000}
admin_url=${CAISSE_BENCH_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

caisse=${CAISSE_BIN:-}
load=${CAISSE_LOAD_BIN:-}
if [ -z "$caisse" ] || [ -z "$load" ]; then
  (cd "$root" && cargo build --release --bin caisse --bin caisse-load)
  caisse="${CARGO_TARGET_DIR:-$root/target}/release/caisse"
  load="${CARGO_TARGET_DIR:-$root/target}/release/caisse-load"
fi
psql_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
psql=${psql_bin:+$psql_bin/}psql

# The same server and parameters, another database: postgres://user@host:port/DB?params.
base=${admin_url%%\?*}
params=${admin_url#"$base"}
case "$base" in
  *://*/*) db_url="${base%/*}/caisse_cluster_bench$params" ;;
  *) db_url="$base/caisse_cluster_bench$params" ;;
esac
"$psql" -X -q -d "$admin_url" -c "DROP DATABASE IF EXISTS caisse_cluster_bench WITH (FORCE)" \
  -c "CREATE DATABASE caisse_cluster_bench"

work=$(mktemp -d "${TMPDIR:-/tmp}/caisse-cluster.XXXXXX")
pids=()
killer=
cleanup() {
  if [ -n "$killer" ]; then kill "$killer" 2>/dev/null || true; fi
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

"$load" --prepare "$db_url" --merchants "$merchants" --merchants-file "$work/merchants.jsonl" 2>"$work/prepare.log" \
  || { cat "$work/prepare.log" >&2; exit 1; }
targets=()
for i in $(seq 1 "$nodes"); do
  port=$((18080 + i))
  env CAISSE_STORE="$db_url" CAISSE_NODE_ID="node-$i" CAISSE_LISTEN="127.0.0.1:$port" \
    CAISSE_ADVERTISE_URL="http://127.0.0.1:$port" CAISSE_DATA_DIR="$work/node-$i" CAISSE_RATE_LIMIT_PER_S=0 \
    CAISSE_SANDBOX_DELAY_MS=200 CAISSE_WEBHOOK_RETRY_SCHEDULE=1s,2s,5s,10s CAISSE_LOG=warn \
    "$caisse" serve >"$work/node-$i.log" 2>&1 &
  pids+=($!)
  targets+=("http://127.0.0.1:$port")
done
for target in "${targets[@]}"; do
  for _ in $(seq 1 150); do
    curl -sf "$target/v1/ping" >/dev/null && break
    sleep 0.2
  done
done

# Until every node holds its share of the 64 shards (a few lease rounds): before, some merchants answer 503
# while their shard moves, which is a start-up cost, not the load's.
share=$((64 / nodes - 1))
for _ in $(seq 1 150); do
  settled=$("$psql" -X -q -t -A -d "$db_url" -c "SELECT count(*) = $nodes AND min(n) >= $share FROM \
    (SELECT count(*) AS n FROM caisse_shards WHERE expires_at > now() GROUP BY owner) AS held")
  [ "$settled" = t ] && break
  sleep 0.2
done

if [ -n "$kill_at" ]; then
  victim=${pids[$((nodes - 1))]}
  (sleep "$kill_at" && kill -9 "$victim" && echo "killed node-$nodes at ${kill_at} s" >&2) &
  killer=$!
fi
joined=$(IFS=,; echo "${targets[*]}")
"$load" --target "$joined" --merchants-file "$work/merchants.jsonl" --rate "$rate" --duration "$duration" \
  --server-pid "${pids[0]}"
