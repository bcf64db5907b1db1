#!/usr/bin/env bash
# A soak: the two-step workload of the README's figures at full load, without a break,
# for MINUTES minutes on one database of the README's Postgres (a throwaway cluster from
# scripts/dev-postgres.sh, autovacuum on, as it comes), sampled every WINDOW seconds:
# completed/s, server and Postgres CPU per completed request, the size of the tables that
# grow with traffic (service_requests, steps_status and everything beside them that holds
# a request's data, partitions included, indexes and TOAST too), dead tuples, vacuum
# runs, WAL, and the partitions attached. Writes perf/runs/<date>-<host>/<commit>-<tag>/
# with the samples (samples.csv), a summary (README.md: first and last five minutes,
# their ratios, the bounds of issue 45) and a plot of rate and CPU per request against
# time and size (soak.svg).
#
#   BIN=target/release/clamp scripts/bench-soak.sh
#   BIN=/tmp/bins/clamp-212db38 MINUTES=30 TAG=soak-212db38 scripts/bench-soak.sh
#   BIN=… SERVER_FLAGS='--retention-days 0.003472 --partition-skew-seconds 60' TAG=soak-retention scripts/bench-soak.sh
#   BIN=… SEED=10000000 TAG=soak-seeded scripts/bench-soak.sh
#
# Settings: BIN (the server binary), MINUTES (30), WINDOW (60, seconds per sample), CONNS
# (64, wrk's connections), SERVER_FLAGS (extra server flags, split into words), SEED (0:
# that many finished two-step requests, and their step records, written before the start
# as clamp writes them, spread over the SEED_HOURS (24) before it; through the server's
# own insert into whatever table layout its migrations made), TAG (soak), NOTIFY (1: the
# workflow tells each COMPLETED to nginx over HTTP, the outbox counts among the tables
# that grow, and the notifications still pending at the end go to notify.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
: "${BIN:?BIN=path of the server binary}"
MINUTES=${MINUTES:-30}
WINDOW=${WINDOW:-60}
CONNS=${CONNS:-64}
SEED=${SEED:-0}
SEED_HOURS=${SEED_HOURS:-24}
tag=${TAG:-soak}
[ -x "$BIN" ] || { echo "bench-soak: BIN=$BIN is not an executable" >&2; exit 1; }
need wrk wrk
need nginx nginx
need psql postgresql-client

out=$(bench_out "$tag")
tmp=$(mktemp -d /tmp/bench-soak.XXXXXX)
chmod 755 "$tmp"
pg_dir=$(mktemp -d /tmp/bench-soak-pg.XXXXXX)
server_pid='' wrk_pid='' nginx_pid=''
cleanup() {
  stop "$wrk_pid" "$server_pid" "$nginx_pid"
  scripts/dev-postgres.sh stop "$pg_dir" >/dev/null 2>&1 || true
  rm -rf "$tmp" "$pg_dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

pg_port=$(free_port)
# Every autovacuum and autoanalyze run is logged with its CPU time, so the record can say
# what the database spent on vacuum, per window and per partition (the set taking the
# traffic, or one left behind).
base=$(PG_EXTRA_CONF="log_autovacuum_min_duration = 0
log_timezone = 'UTC'" scripts/dev-postgres.sh start "$pg_dir" "$pg_port")
base=${base%/clamp}
postmaster=$(head -1 "$pg_dir/postmaster.pid")
db=clamp_soak
url="$base/$db"
q() { psql "$url" -qAtX -v ON_ERROR_STOP=1 -c "$1"; }

nginx_port=$(free_port)
mkdir -p "$tmp/nginx/logs"
start_nginx "$tmp/nginx" "server { listen 127.0.0.1:$nginx_port; location / { default_type application/json; return 200 '{\"ok\":true}'; } }"
for _ in $(seq 1 50); do curl -sf -o /dev/null -X POST -d x "http://127.0.0.1:$nginx_port/a" && break; sleep 0.1; done

port=$(free_port)
server_cmd="$BIN --port $port --bind 127.0.0.1 --database-url $url ${SERVER_FLAGS:-}"
# SERVER_FLAGS is split into words on purpose.
# shellcheck disable=SC2086
serve "$port" "$tmp/server.log" $server_cmd
notify=
[ "${NOTIFY:-0}" != 1 ] || notify=",\"notify\":[{\"on\":[\"COMPLETED\"],\"http\":{\"url\":\"http://127.0.0.1:$nginx_port/told\"}}]"
workflow="{\"name\":\"two\",\"description\":\"soak\"$notify,\"steps\":[{\"name\":\"a\",\"mode\":\"HTTP\",\"val\":{\"method\":\"POST\",\"url\":\"http://127.0.0.1:$nginx_port/a\"}},{\"name\":\"b\",\"mode\":\"HTTP\",\"val\":{\"method\":\"POST\",\"url\":\"http://127.0.0.1:$nginx_port/b\"}}]}"
curl -sf -o /dev/null -X POST -H 'Content-Type: application/json' -d "$workflow" "http://127.0.0.1:$port/workflow"

if [ "$SEED" -gt 0 ]; then
  # Finished two-step requests as the server writes them: the row COMPLETED at its last
  # step, two step records each, ids UUIDv7 of their creation millisecond. Inserted through
  # the parent tables, so whatever layout the migrations made (partitions or not) takes
  # them as it takes the server's own rows. In chunks, each its own transaction.
  echo "seeding $SEED finished requests over the $SEED_HOURS hours before the start"
  seed_start=$(date +%s)
  chunk=500000
  done_=0
  while [ "$done_" -lt "$SEED" ]; do
    n=$((SEED - done_ < chunk ? SEED - done_ : chunk))
    q "WITH r AS (
         SELECT (lpad(to_hex((extract(epoch FROM t) * 1000)::bigint), 12, '0') || '7' ||
                 substr(md5(g::text), 1, 3) || '8' || substr(md5(g::text), 4, 15))::uuid AS id, t
         FROM (SELECT g, now() - interval '$SEED_HOURS hours'
                          + (g * (interval '$SEED_HOURS hours' / $SEED)) AS t
               FROM generate_series($((done_ + 1)), $((done_ + n))) g) s
       ), ins AS (
         INSERT INTO service_requests (id, workflow_name, status, payload, headers,
             current_step_id, created_at, updated_at, finished_at, workflow_version)
         SELECT id, 'two', 'COMPLETED', '{}', '[]', 2, t, t + interval '4 ms',
                t + interval '4 ms', 1 FROM r
       )
       INSERT INTO steps_status (service_request_id, step_id, step_name, status, request,
           response, started_at, finished_at, time_taken_ms, attempts)
       SELECT id, k, CASE k WHEN 1 THEN 'a' ELSE 'b' END, 'COMPLETED', '',
              '{\"ok\":true}', t + (k - 1) * interval '2 ms', t + k * interval '2 ms', 2, 1
       FROM r, generate_series(1, 2) k" >/dev/null
    done_=$((done_ + n))
    echo "  seeded $done_"
  done
  q "VACUUM ANALYZE" >/dev/null
  seed_secs=$(( $(date +%s) - seed_start ))
  echo "seeded in ${seed_secs}s"
fi

# What grows with traffic: the request tables and those beside them, each with its
# partitions (pg_partition_tree), indexes and TOAST.
size_sql="SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0)::bigint
  FROM (VALUES ('service_requests'), ('steps_status'), ('event_takes'), ('fan_joins'),
               ('idempotency_keys'), ('events'), ('dead_letters'), ('audit_log'),
               ('notifications')) v(name)
  JOIN LATERAL (SELECT relid FROM pg_partition_tree(to_regclass(v.name)) WHERE isleaf
                UNION SELECT to_regclass(v.name)
                WHERE (SELECT relkind FROM pg_class WHERE oid = to_regclass(v.name)) = 'r') t ON true"
stats_sql="SELECT coalesce(sum(n_dead_tup), 0), coalesce(sum(autovacuum_count + vacuum_count), 0),
    coalesce(sum(n_live_tup), 0), count(*) FILTER (WHERE relname ~ '^service_requests_p')
  FROM pg_stat_user_tables WHERE relname ~ '^(service_requests|steps_status)'"
finished() {
  curl -s "http://127.0.0.1:$port/metrics" | awk '$1 == "completed_service_request_handler_counter_total" {c = $2}
    $1 == "failed_service_request_handler_counter_total" {f = $2}
    $1 == "create_service_request_handler_counter_total{status=\"2xx\"}" {n = $2}
    $1 == "clamp_retention_deleted_total" {r = $2} END {printf "%d %d %d %d\n", c + f, n, r, f}'
}
now() { date +%s.%N; }

echo "minute,t,completed,created,dropped,failed,server_ticks,pg_ticks,bytes,dead,vacuums,live,partitions,wal" > "$tmp/samples.csv"
sample() {  # sample MINUTE
  local c n r f s p b dead vac live parts wal
  read -r c n r f < <(finished)
  s=$(proc_ticks "$server_pid"); p=$(tree_ticks "$postmaster")
  b=$(q "$size_sql")
  IFS='|' read -r dead vac live parts < <(q "$stats_sql")
  wal=$(q "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
  echo "$1,$(now),$c,$n,$r,$f,$s,$p,$b,$dead,$vac,$live,$parts,$wal" >> "$tmp/samples.csv"
}

wrk_cmd="wrk -t1 -c$CONNS -d$((MINUTES * 60 + 5))s -s perf/wrk/create.lua http://127.0.0.1:$port -- two"
sample 0
$wrk_cmd > "$tmp/wrk.txt" 2>&1 &
wrk_pid=$!
start=$(date +%s)
for m in $(seq 1 $((MINUTES * 60 / WINDOW))); do
  sleep $(( start + m * WINDOW - $(date +%s) ))
  sample "$m"
  tail -1 "$tmp/samples.csv" | awk -F, -v w="$WINDOW" '{printf "sample %s: %s completed, %.2f GB, %s dead, %s partitions\n", $1, $3, $9 / 1e9, $10, $13}'
done
wait "$wrk_pid" || true
wrk_pid=
# Every created request: still in the tables, or finished and dropped by retention.
sleep 5
read -r c n r f < <(finished)
rows=$(q "SELECT count(*) FROM service_requests WHERE workflow_name = 'two'")
open_rows=$(q "SELECT count(*) FROM service_requests WHERE workflow_name = 'two' AND status NOT IN ('COMPLETED', 'FAILED')")
seeded_left=$(q "SELECT count(*) FROM service_requests WHERE workflow_name = 'two' AND created_at < to_timestamp($start)")
if [ "${NOTIFY:-0}" = 1 ]; then
  q "SELECT state, count(*), max(delivered_at - finished_at) FROM notifications GROUP BY state" > "$out/notify.txt"
fi
stop "$server_pid"; server_pid=
cp "$tmp/samples.csv" "$out/samples.csv"
cp "$tmp/wrk.txt" "$out/wrk.txt"
grep -iE "partition|retention|error|warn" "$tmp/server.log" | tail -40 > "$out/server-log-excerpt.txt" || true
python3 scripts/soak_report.py autovacuum < "$pg_dir/server.log" > "$out/autovacuum.csv"

export SK_OUT=$out SK_BIN=$BIN SK_SERVER="$server_cmd" SK_WRK="$wrk_cmd" SK_PG="$(pg_settings "$base" autovacuum autovacuum_naptime log_autovacuum_min_duration)" \
  SK_PGCMD="scripts/dev-postgres.sh start <tmpdir> <port>" SK_MINUTES=$MINUTES SK_WINDOW=$WINDOW SK_SEED=$SEED \
  SK_CREATED=$n SK_COMPLETED=$c SK_DROPPED=$r SK_FAILED=$f SK_ROWS=$rows SK_OPEN=$open_rows SK_SEEDED_LEFT=$seeded_left \
  SK_CONNS=$CONNS SK_MACHINE="$(machine_line)" SK_GIT="$(git_rev)" SK_TAG=$tag SK_SEED_SECS=${seed_secs:-0}
python3 scripts/soak_report.py
echo "bench-soak: $out/README.md"
