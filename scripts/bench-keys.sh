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
. scripts/bench-lib.sh
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
wait_up $port
pg_settings=$(pg_settings "$base")

# Cumulative CPU ticks (1/100 s) of the server and of every Postgres process.
ticks() { echo "$(proc_ticks $server_pid) $(sum_ticks postgres)"; }
gen() {  # gen <kind> <extra flags...>: one round; prints rate, errors, server and Postgres µs per request
  local kind=$1; shift
  "$bin/clamp-bench" "$kind" --url "http://127.0.0.1:$port" -c "$CONNS" -t 2 -d "${DURATION}s" --warmup 1s -q \
    "$@" --json "/tmp/$tag-$kind.json" >/dev/null &
  local g=$! a b
  # CPU is sampled inside the measured window (after the warm-up, before the end).
  sleep 2; a=$(ticks); sleep $((DURATION - 2)); b=$(ticks)
  wait $g
  python3 -c "
import json
j = json.load(open('/tmp/$tag-$kind.json')); r = j['achieved_rate']
a, b = map(int, '$a'.split()), map(int, '$b'.split())
(s0, p0), (s1, p1) = list(a), list(b)
secs = $DURATION - 2
print(round(r), sum(j.get('errors', {}).values()), f'{(s1 - s0) * 1e4 / secs / r:.1f}', f'{(p1 - p0) * 1e4 / secs / r:.1f}')"
}
gen_cmd="$bin/clamp-bench create --url http://127.0.0.1:$port -c $CONNS -t 2 -d ${DURATION}s --warmup 1s [--idempotency-keys]"
rows=()
for round in $(seq 1 "$ROUNDS"); do
  read -r h he _ _ < <(gen health)
  if [ $((round % 2)) = 1 ]; then
    read -r p pe ps pp < <(gen create --downstream http://127.0.0.1:9)
    read -r k ke ks kp < <(gen create --downstream http://127.0.0.1:9 --idempotency-keys)
  else
    read -r k ke ks kp < <(gen create --downstream http://127.0.0.1:9 --idempotency-keys)
    read -r p pe ps pp < <(gen create --downstream http://127.0.0.1:9)
  fi
  rows+=("$round $h $p $k $((he + pe + ke)) $ps $pp $ks $kp")
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
  echo "| round | /health | create | create with a key | keyed ÷ plain | plain ÷ health | keyed ÷ health | errors | µs/request plain (server + Postgres) | µs/request keyed |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  for r in "${rows[@]}"; do
    set -- $r
    python3 -c "print(f'| $1 | {$2:,} | {$3:,} | {$4:,} | {$4/$3:.2f} | {$3/$2:.2f} | {$4/$2:.2f} | $5 | $6 + $7 | $8 + $9 |')"
  done
  echo
  printf '%s\n' "${rows[@]}" | python3 -c "
import sys, statistics
rows = [l.split() for l in sys.stdin if l.strip()]
m = lambda f: statistics.median(f(r) for r in rows)
print(f'Median keyed ÷ plain: **{m(lambda r: int(r[3]) / int(r[2])):.2f}** (plain ÷ health {m(lambda r: int(r[2]) / int(r[1])):.2f}, keyed ÷ health {m(lambda r: int(r[3]) / int(r[1])):.2f}).')
print(f'Median CPU per request: plain {m(lambda r: float(r[5])):.1f} µs server + {m(lambda r: float(r[6])):.1f} µs Postgres; keyed {m(lambda r: float(r[7])):.1f} + {m(lambda r: float(r[8])):.1f} µs.')"
  echo
  echo "Rows after the run (service requests, idempotency keys): $stored"
} | tee "$out/$tag.md"
