#!/usr/bin/env bash
# Measures the API alone with wrk (issue 6): GET /v1/paiement/{reference} and POST /v1/paiement/initier against
# a `caisse serve` on loopback, on a fresh data directory, with one sandbox merchant.
#
#   benches/wrk/run.sh
#
# Environment (defaults in brackets): WRK_THREADS [2], WRK_CONNECTIONS [64], WRK_DURATION [20s],
# CAISSE_WRK_PORT [18080], CAISSE_LOG [info: the server's default; its log goes to a file],
# CAISSE_BIN [build with `cargo build --release` and use ${CARGO_TARGET_DIR:-target}/release/caisse].
#
# The per-key rate limit (rate_limit_per_s, default 1,000 requests/s with a burst of 2,000) would answer most
# of the requests 429, since all of them use one key: the server runs with CAISSE_RATE_LIMIT_PER_S=0 (off).
# The GET runs first, on a store holding the one seeded payment; the POST then creates a payment per request,
# each of which goes on with its sandbox life (notices after CAISSE_SANDBOX_DELAY_MS, default 2 s) while wrk
# runs, as it would in production. wrk counts answers other than 2xx/3xx in "Non-2xx or 3xx responses".
set -euo pipefail

threads=${WRK_THREADS:-2}
connections=${WRK_CONNECTIONS:-64}
duration=${WRK_DURATION:-20s}
port=${CAISSE_WRK_PORT:-18080}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

if ! command -v wrk >/dev/null; then
  echo "wrk is not installed; installing the Debian package" >&2
  apt-get install -y wrk >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y wrk >/dev/null; }
fi

caisse=${CAISSE_BIN:-}
if [ -z "$caisse" ]; then
  (cd "$root" && cargo build --release --bin caisse)
  caisse="${CARGO_TARGET_DIR:-$root/target}/release/caisse"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/caisse-wrk.XXXXXX")
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# `merchant create` needs the store to itself, so it runs before the server starts.
created=$("$caisse" --data-dir "$work/data" merchant create --name "wrk" --email "wrk@example.com" --json)
key=$(printf '%s' "$created" | sed -n 's/.*"secret_key":"\([^"]*\)".*/\1/p')
[ -n "$key" ] || { echo "no secret key in: $created" >&2; exit 1; }

CAISSE_RATE_LIMIT_PER_S=0 CAISSE_LOG=${CAISSE_LOG:-info} \
  "$caisse" --data-dir "$work/data" serve --listen "127.0.0.1:$port" >"$work/server.log" 2>&1 &
server_pid=$!
base="http://127.0.0.1:$port"
for _ in $(seq 100); do
  curl -fsS "$base/v1/ping" >/dev/null 2>&1 && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; exit 1; }
  sleep 0.1
done
curl -fsS "$base/v1/ping" >/dev/null

rss() { awk '/^VmRSS:/ { printf "%.1f MiB", $2 / 1024 }' "/proc/$server_pid/status"; }

seeded=$(curl -fsS -X POST "$base/v1/paiement/initier" -H "Authorization: Bearer $key" \
  -H "Content-Type: application/json" \
  -d '{"montant":10000,"devise":"XOF","fournisseur":"mtn_momo","client_telephone":"+22997000055"}')
reference=$(printf '%s' "$seeded" | sed -n 's/.*"reference":"\([^"]*\)".*/\1/p')
[ -n "$reference" ] || { echo "no reference in: $seeded" >&2; exit 1; }

echo "caisse serve pid $server_pid on $base, rate limit off, log ${CAISSE_LOG:-info} to a file; RSS $(rss)"
echo
echo "== GET /v1/paiement/$reference  (wrk -t$threads -c$connections -d$duration --latency)"
CAISSE_KEY=$key wrk -t"$threads" -c"$connections" -d"$duration" --latency -s "$here/lookup.lua" \
  "$base/v1/paiement/$reference"
echo "server RSS after: $(rss)"
echo
echo "== POST /v1/paiement/initier  (wrk -t$threads -c$connections -d$duration --latency)"
CAISSE_KEY=$key wrk -t"$threads" -c"$connections" -d"$duration" --latency -s "$here/initier.lua" \
  "$base/v1/paiement/initier"
echo "server RSS after: $(rss)"
