#!/bin/bash
# usage: [PERF_RECORD='<perf record options>'] [SECS=<seconds sampled>] prof.sh <bin> <tag>
# (defaults: '-F 999 -g', 8)
bin=$1; tag=$2; shift 2; db=prof_$tag
psql -h 127.0.0.1 -U postgres -qc "drop database if exists $db" -c "create database $db" >/dev/null 2>&1
$bin --port 18181 --bind 127.0.0.1 --database-url postgres://postgres@127.0.0.1:5432/$db "$@" > /tmp/prof/$tag.log 2>&1 &
pid=$!
for i in $(seq 50); do curl -s localhost:18181/health >/dev/null && break; sleep 0.2; done
curl -s -XPOST localhost:18181/workflow -H 'content-type: application/json' -d '{"name":"two","description":"bench","steps":[{"name":"a","mode":"HTTP","val":{"method":"POST","url":"http://127.0.0.1:47777/a"}},{"name":"b","mode":"HTTP","val":{"method":"POST","url":"http://127.0.0.1:47777/b"}}]}' >/dev/null
wrk -t1 -c64 -d3s -s /work/main/perf/wrk/create.lua http://127.0.0.1:18181 -- two >/dev/null
wrk -t1 -c64 -d12s -s /work/main/perf/wrk/create.lua http://127.0.0.1:18181 -- two > /tmp/prof/$tag.wrk &
w=$!
sleep 2
perf record ${PERF_RECORD:--F 999 -g} -p $pid -o /tmp/prof/$tag.data -- sleep ${SECS:-8} 2>/dev/null >/dev/null
perf stat -e task-clock,context-switches,cpu-migrations,page-faults -p $pid -- sleep 1 2> /tmp/prof/$tag.stat
wait $w
kill $pid; sleep 1
grep Requests/sec /tmp/prof/$tag.wrk
