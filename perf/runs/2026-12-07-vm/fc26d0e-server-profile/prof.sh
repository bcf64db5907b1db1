#!/usr/bin/env bash
# pgprof.sh BIN OUT [secs]: one server binary under the two-step create load; perf record of the whole machine for
# the middle of the wrk run; flat profile of postgres and the server written to OUT.*
set -euo pipefail
cd /work/main
. scripts/bench-lib.sh
BIN=$1 OUT=$2 SECS=${3:-20}
tmp=$(mktemp -d /tmp/pgprof.XXXXXX); chmod 755 $tmp
pg_dir=$(mktemp -d /tmp/pgprof-pg.XXXXXX)
server_pid='' nginx_pid=''
cleanup() { stop "$server_pid" "$nginx_pid"; scripts/dev-postgres.sh stop "$pg_dir" >/dev/null 2>&1 || true; rm -rf "$tmp" "$pg_dir"; }
trap cleanup EXIT
pg_port=$(free_port)
base=$(PG_EXTRA_CONF="${PG_EXTRA_CONF:-}" scripts/dev-postgres.sh start "$pg_dir" "$pg_port"); base=${base%/clamp}
nginx_port=$(free_port)
start_nginx "$tmp/nginx" "server { listen 127.0.0.1:$nginx_port; location / { default_type application/json; return 200 '{\"ok\":true}'; } }"
sleep 0.5
port=$(free_port)
psql "$base/postgres" -qAtc "DROP DATABASE IF EXISTS prof WITH (FORCE)" >/dev/null
serve "$port" "$tmp/server.log" "$BIN" --port "$port" --bind 127.0.0.1 --database-url "$base/prof" ${SERVER_FLAGS:-}
curl -sf -o /dev/null -X POST -H 'Content-Type: application/json' -d "{\"name\":\"two\",\"description\":\"bench\",\"steps\":[{\"name\":\"a\",\"mode\":\"HTTP\",\"val\":{\"method\":\"POST\",\"url\":\"http://127.0.0.1:$nginx_port/a\"}},{\"name\":\"b\",\"mode\":\"HTTP\",\"val\":{\"method\":\"POST\",\"url\":\"http://127.0.0.1:$nginx_port/b\"}}]}" "http://127.0.0.1:$port/workflow"
[ -z "${SQL:-}" ] || psql "$base/prof" -qAt -c "$SQL"
[ -z "${PRE_SQL:-}" ] || psql "$base/prof" -qAt -c "$PRE_SQL"
export BENCH_KEYS=0 BENCH_TOKEN=
wrk -t1 -c64 -d$((SECS+6))s -s perf/wrk/create.lua "http://127.0.0.1:$port" -- two > $OUT.wrk &
wpid=$!
sleep 3
if [ -n "${PERF_PG:-}" ]; then
  perf record -F 499 --call-graph dwarf,32768 -p "$(pgrep -d, -f 'postgres: .* prof ')" -o $OUT.data -- sleep $SECS 2>/dev/null >/dev/null
else
  perf record -a -F 1999 -o $OUT.data -- sleep $SECS 2>/dev/null >/dev/null
fi
wait $wpid
[ -z "${AFTER_SQL:-}" ] || psql "$base/prof" -qAtX -F " | " -c "$AFTER_SQL" > $OUT.after.txt
perf report -i $OUT.data --comm postgres --sort sym --stdio --no-children 2>/dev/null | grep -v '^#' | grep -v '^$' > $OUT.pg.txt || true
perf report -i $OUT.data --sort comm --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' > $OUT.comm.txt || true
cat $OUT.wrk | grep -E 'Requests/sec'
perf report -i $OUT.data --sort comm,sym --stdio --no-children 2>/dev/null | grep -v '^#' | grep -v '^$' | grep "clamp" > $OUT.server.txt || true
