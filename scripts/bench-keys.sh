#!/usr/bin/env bash
# The cost of an Idempotency-Key: POST /serviceRequest with a fresh key per request against
# the same creates without one, as alternating closed-loop rounds against one API-only
# server (--max-running 0), on a throwaway Postgres with the settings of docs/configuration.md
# (scripts/dev-postgres.sh). Each round also measures GET /health, the ceiling. The figure
# is the median over the rounds of keyed ÷ plain. The two alternate which goes first (the
# tables grow as the run goes on, and the one measured second would meet larger tables).
# The order of each round comes from ab_order (scripts/bench-lib.sh): plain is A, keyed B.
# Writes perf/runs/<date>-<host>/<commit>-<tag>/<tag>.md and <tag>-server.log.
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
tag=${TAG:-keys-c$CONNS}
out=$(bench_out "$tag")
pg_dir=/tmp/clamp-bench-keys-pg
pg_port=55496
base=$(scripts/dev-postgres.sh start $pg_dir $pg_port); base=${base%/clamp}
db=clamp_bench_keys
port=18310
server_cmd="$bin/clamp --port $port --bind 127.0.0.1 --database-url $base/$db --max-running 0 ${SERVER_FLAGS:-}"
fresh_db "$base" "$db"
server_pid=''
trap 'stop "$server_pid"; scripts/dev-postgres.sh stop $pg_dir >/dev/null' EXIT
# shellcheck disable=SC2086  # the command and SERVER_FLAGS are split into words on purpose
serve "$port" "$out/$tag-server.log" $server_cmd
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
  python3 - "/tmp/$tag-$kind.json" "$a" "$b" $((DURATION - 2)) <<'PY'
import json, sys
sys.path.insert(0, "scripts")
from benchmath import cpu_per
j = json.load(open(sys.argv[1])); r = j['achieved_rate']
(s0, p0), (s1, p1) = map(int, sys.argv[2].split()), map(int, sys.argv[3].split())
n = int(sys.argv[4]) * r  # requests in the sampled window
print(round(r), sum(j.get('errors', {}).values()), f'{cpu_per(s1 - s0, n):.1f}', f'{cpu_per(p1 - p0, n):.1f}')
PY
}
gen_cmd="$bin/clamp-bench create --url http://127.0.0.1:$port -c $CONNS -t 2 -d ${DURATION}s --warmup 1s [--idempotency-keys]"
rows=()
for round in $(seq 1 "$ROUNDS"); do
  read -r h he _ _ < <(gen health)
  for side in $(ab_order "$round"); do
    if [ "$side" = A ]; then
      read -r p pe ps pp < <(gen create --downstream http://127.0.0.1:9)
    else
      read -r k ke ks kp < <(gen create --downstream http://127.0.0.1:9 --idempotency-keys)
    fi
  done
  rows+=("$round $h $p $k $((he + pe + ke)) $ps $pp $ks $kp")
  echo "round $round: health $h/s, create $p/s, keyed create $k/s, errors $((he + pe + ke))"
done
stored=$(psql "$base/$db" -Atc "select (select count(*) from service_requests), (select count(*) from idempotency_keys)")
{
  echo "# Idempotency-Key cost: keyed creates against plain creates, $CONNS connections"
  echo
  echo "- $(machine_line)"
  echo "- git: $(git_rev)"
  echo "- server: \`$server_cmd\`"
  echo "- generator, per round: \`$bin/clamp-bench health …\`, then \`$gen_cmd\` without and with the flag (a fresh key per request)"
  echo "- Postgres: throwaway cluster from \`scripts/dev-postgres.sh\` (the settings of docs/configuration.md): $pg_settings"
  echo "- everything (server, Postgres, generator) shares the machine"
  echo
  echo "| round | /health | create | create with a key | keyed ÷ plain | plain ÷ health | keyed ÷ health | errors | µs/request plain (server + Postgres) | µs/request keyed |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}" | python3 -c "
import sys
sys.path.insert(0, 'scripts')
from benchmath import median, ratio
rows = [l.split() for l in sys.stdin if l.strip()]
for r in rows:
    n, h, p, k, e, ps, pp, ks, kp = r
    h, p, k = int(h), int(p), int(k)
    print(f'| {n} | {h:,} | {p:,} | {k:,} | {ratio(k, p):.2f} | {ratio(p, h):.2f} | {ratio(k, h):.2f} | {e} | {ps} + {pp} | {ks} + {kp} |')
print()
m = lambda f: median(f(r) for r in rows)
print(f'Median keyed ÷ plain: **{m(lambda r: ratio(r[3], r[2])):.2f}** (plain ÷ health {m(lambda r: ratio(r[2], r[1])):.2f}, keyed ÷ health {m(lambda r: ratio(r[3], r[1])):.2f}).')
print(f'Median CPU per request: plain {m(lambda r: float(r[5])):.1f} µs server + {m(lambda r: float(r[6])):.1f} µs Postgres; keyed {m(lambda r: float(r[7])):.1f} + {m(lambda r: float(r[8])):.1f} µs.')"
  echo
  echo "Rows after the run (service requests, idempotency keys): $stored"
} | tee "$out/$tag.md"
