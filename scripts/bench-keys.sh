#!/usr/bin/env bash
# The cost of an Idempotency-Key: POST /serviceRequest with a fresh key per request against
# the same creates without one, as alternating closed-loop rounds against one API-only
# server (--max-running 0), on a throwaway Postgres with the README's settings
# (scripts/dev-postgres.sh). Each round also measures GET /health, the ceiling. The figure
# is the median over the rounds of keyed ÷ plain. The two alternate which goes first (the
# tables grow as the run goes on, and the one measured second would meet larger tables).
# Writes perf/runs/<date>-<host>/<tag>.md.
#
#   scripts/bench-keys.sh                       # 128 connections, 6 rounds of 8 s
#   CONNS=256 ROUNDS=7 TAG=keys-c256 scripts/bench-keys.sh
set -euo pipefail
cd "$(dirname "$0")/.."
CONNS=${CONNS:-128}
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-6}
bin=${BIN:-target/release}
[ -n "${BIN:-}" ] || cargo build --release --workspace --bins -q
out=perf/runs/$(date -u +%Y-%m-%d)-$(hostname)
mkdir -p "$out"
tag=${TAG:-keys-c$CONNS}
pg_dir=/tmp/clamp-bench-keys-pg
pg_port=55496
base=$(scripts/dev-postgres.sh start $pg_dir $pg_port); base=${base%/clamp}
db=clamp_bench_keys
port=18310
server_cmd="$bin/clamp --port $port --bind 127.0.0.1 --database-url $base/$db --max-running 0 ${SERVER_FLAGS:-}"
psql "$base/postgres" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
$server_cmd > "$out/$tag-server.log" 2>&1 &
server_pid=$!
trap 'kill $server_pid 2>/dev/null || true; scripts/dev-postgres.sh stop $pg_dir >/dev/null' EXIT
for _ in $(seq 1 100); do curl -sf "localhost:$port/health" >/dev/null && break; sleep 0.1; done
pg_settings=$(psql "$base/postgres" -Atc "select string_agg(name || '=' || current_setting(name), ', ' order by name) from pg_settings where name in ('max_wal_size', 'checkpoint_timeout', 'shared_buffers', 'synchronous_commit', 'fsync')")

gen() {  # gen <kind> <extra flags...>: runs one round, prints the achieved rate
  local kind=$1; shift
  "$bin/clamp-bench" "$kind" --url "http://127.0.0.1:$port" -c "$CONNS" -t 2 -d "${DURATION}s" --warmup 1s -q \
    "$@" --json "/tmp/$tag-$kind.json" >/dev/null
  python3 -c "import json; j=json.load(open('/tmp/$tag-$kind.json')); print(round(j['achieved_rate']), sum(j.get('errors', {}).values()))"
}
gen_cmd="$bin/clamp-bench create --url http://127.0.0.1:$port -c $CONNS -t 2 -d ${DURATION}s --warmup 1s [--idempotency-keys]"
rows=()
for round in $(seq 1 "$ROUNDS"); do
  read -r h he < <(gen health)
  if [ $((round % 2)) = 1 ]; then
    read -r p pe < <(gen create --downstream http://127.0.0.1:9)
    read -r k ke < <(gen create --downstream http://127.0.0.1:9 --idempotency-keys)
  else
    read -r k ke < <(gen create --downstream http://127.0.0.1:9 --idempotency-keys)
    read -r p pe < <(gen create --downstream http://127.0.0.1:9)
  fi
  rows+=("$round $h $p $k $((he + pe + ke))")
  echo "round $round: health $h/s, create $p/s, keyed create $k/s, errors $((he + pe + ke))"
done
stored=$(psql "$base/$db" -Atc "select (select count(*) from service_requests), (select count(*) from idempotency_keys)")
{
  echo "# Idempotency-Key cost: keyed creates against plain creates, $CONNS connections"
  echo
  echo "- date: $(date -u +%FT%TZ), host $(hostname), nproc $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "- git: $(git rev-parse --short HEAD 2>/dev/null || echo none)"
  echo "- server: \`$server_cmd\`"
  echo "- generator, per round: \`$bin/clamp-bench health …\`, then \`$gen_cmd\` without and with the flag (a fresh key per request)"
  echo "- Postgres: throwaway cluster from \`scripts/dev-postgres.sh\` (the README's settings): $pg_settings"
  echo "- everything (server, Postgres, generator) shares the machine"
  echo
  echo "| round | /health | create | create with a key | keyed ÷ plain | plain ÷ health | keyed ÷ health | errors |"
  echo "|---|---|---|---|---|---|---|---|"
  for r in "${rows[@]}"; do
    set -- $r
    python3 -c "print(f'| $1 | {$2:,} | {$3:,} | {$4:,} | {$4/$3:.2f} | {$3/$2:.2f} | {$4/$2:.2f} | $5 |')"
  done
  echo
  printf '%s\n' "${rows[@]}" | python3 -c "
import sys, statistics
rows = [list(map(int, l.split())) for l in sys.stdin if l.strip()]
print(f'Median keyed ÷ plain: **{statistics.median(r[3]/r[2] for r in rows):.2f}** (plain ÷ health {statistics.median(r[2]/r[1] for r in rows):.2f}, keyed ÷ health {statistics.median(r[3]/r[1] for r in rows):.2f}).')"
  echo
  echo "Rows after the run (service requests, idempotency keys): $stored"
} | tee "$out/$tag.md"
