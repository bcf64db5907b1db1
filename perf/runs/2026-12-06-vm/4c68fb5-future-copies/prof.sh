#!/usr/bin/env bash
# prof.sh BIN OUTNAME [secs]: profile server BIN (flat, perf cpu-clock) under the two-step load on a fresh db
set -euo pipefail
cd /work/main
. scripts/bench-lib.sh
BIN=$1; NAME=$2; SECS=${3:-20}
PGPORT=55499; PGDIR=/tmp/prof-pg
if ! pg_isready -h 127.0.0.1 -p $PGPORT >/dev/null 2>&1; then
  rm -rf $PGDIR; scripts/dev-postgres.sh start $PGDIR $PGPORT >/dev/null
fi
base=postgres://postgres@127.0.0.1:$PGPORT
fresh_db $base prof
ng=/tmp/prof-nginx; rm -rf $ng; mkdir -p $ng
start_nginx $ng "server { listen 127.0.0.1:47766; location / { default_type application/json; return 200 '{\"ok\":true}'; } }"
port=36399
serve $port /tmp/prof-server.log $BIN --port $port --bind 127.0.0.1 --database-url $base/prof
curl -sf localhost:$port/workflow -d '{"name":"two","description":"bench","steps":[{"name":"a","mode":"HTTP","val":{"method":"POST","url":"http://127.0.0.1:47766/a"}},{"name":"b","mode":"HTTP","val":{"method":"POST","url":"http://127.0.0.1:47766/b"}}]}' >/dev/null
wrk -t1 -c64 -d5s -s perf/wrk/create.lua http://127.0.0.1:$port -- two >/dev/null
perf record -e cpu-clock -F 1999 ${PERF_G:-} -p $server_pid -o /tmp/$NAME.perf -- sleep $SECS >/dev/null 2>&1 &
pp=$!
wrk -t1 -c64 -d${SECS}s -s perf/wrk/create.lua http://127.0.0.1:$port -- two | grep Requests/sec
wait $pp || true
stop $server_pid $nginx_pid
perf report -i /tmp/$NAME.perf --no-children --sort symbol --stdio 2>/dev/null | grep -v "^#" | grep -v "^$" | head -${TOP:-70} > /tmp/$NAME.txt
echo wrote /tmp/$NAME.txt
