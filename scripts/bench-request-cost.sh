#!/usr/bin/env bash
# What one completed two-step request costs, two server binaries side by side: per round
# and binary (the order alternating from round to round), a fresh database of one
# throwaway Postgres with the settings of docs/configuration.md (pg_stat_statements loaded), the two-step
# HTTP workflow against nginx (a fixed 200 on 127.0.0.1), `wrk -t1 -c64` creates for
# DURATION seconds, then a wait until every created request has completed. Per completed
# request: server CPU, Postgres CPU (this cluster's processes), WAL bytes, commits and
# statements, from wrk's start to the moment the last request completed (B ÷ A of each
# binary's medians, and the median of each round's own B ÷ A, the steadier figure on a
# host whose speed drifts through the run); and, of each
# binary's last round, a per-statement breakdown, the rows each table took (inserts,
# updates and the share of them that were HOT) and each index's scans, buffer touches
# and size. Then (POLL=0 skips it) one run per
# binary of clients that poll (512 users, 20 ms, `clamp-bench e2e` against
# `clamp-bench mock`, as scripts/bench-poll.sh). Writes perf/runs/<date>-<host>/<commit>-<tag>/<tag>.md.
#
# This is the A/B harness: every comparison of two server binaries runs through it (the
# order of each round from ab_order of scripts/bench-lib.sh, which the other side-by-side
# scripts use too).
#
#   A=/tmp/oldtree/target/release/clamp B=target/release/clamp ROUNDS=2 scripts/bench-request-cost.sh
#   ROUNDS=3 DURATION=20 POLL=0 TAG=request-cost-x A=… B=… scripts/bench-request-cost.sh
#
# Settings: ROUNDS (2), DURATION (15, seconds of wrk), CONNS (64), TOKEN (a bearer token
# every call carries), SEED (0; that many requests waiting in the table before each run:
# asleep at a WAIT, paused at an EVENT, some with deadlines; A_SEED and B_SEED: one
# side's own, so that A=B with B_SEED=1000000 prices a table of waiting work), SERVER_FLAGS (both
# binaries), A_FLAGS and B_FLAGS (one binary's own; `@NGINX@` in them becomes nginx's
# base URL, e.g. B_FLAGS='--otlp-endpoint @NGINX@' exports spans to nginx's fixed 200), DEADLINE (120, seconds to wait for completion after wrk), POLL (1; 0 skips
# the polling runs), POLL_ROUNDS (1), POLL_CONNS (512), POLL_INTERVAL (20ms),
# POLL_DURATION (20), BENCH_BIN (target/release/clamp-bench), PGSS (1; 0 runs Postgres
# without pg_stat_statements), TAG (request-cost), A_SCHEME and B_SCHEME (http; https
# makes that side's workflow call nginx over TLS, with a certificate of a CA made for the
# run and given to the server as --step-ca-file: A=B with B_SCHEME=https prices TLS),
# A_CONCURRENCY and B_CONCURRENCY (a `concurrency` object for that side's workflow, e.g.
# '{"key":"payload.k","limit":4}'), KEYS (0; N: each create's payload carries "k", one of N
# keys in turn, on both sides), A_NOTIFY and B_NOTIFY (1: that side's workflow tells each
# COMPLETED to nginx over HTTP, and a round ends only once every notification is delivered,
# by the server's counter: A=B with B_NOTIFY=1 prices a notification), A_SCHEMA and
# B_SCHEMA (1: that side's workflow has an inputSchema of five properties, which every
# create's payload meets: A=B with B_SCHEMA=1 prices the check), A_SQL and B_SQL (SQL
# run on that side's fresh database once its server has migrated it and before the load,
# e.g. a DROP INDEX: A=B with B_SQL=… prices a schema change with one binary), A_RESTART and
# B_RESTART (1: that side's server is stopped and started again after its SQL, before the
# load, so that it starts on the schema the SQL made).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
: "${A:?A=path of the first server binary}" "${B:?B=path of the second server binary}"
ROUNDS=${ROUNDS:-2}
DURATION=${DURATION:-15}
CONNS=${CONNS:-64}
DEADLINE=${DEADLINE:-120}
POLL=${POLL:-1}
SEED=${SEED:-0}
POLL_ROUNDS=${POLL_ROUNDS:-1}
POLL_CONNS=${POLL_CONNS:-512}
POLL_INTERVAL=${POLL_INTERVAL:-20ms}
POLL_DURATION=${POLL_DURATION:-20}
BENCH_BIN=${BENCH_BIN:-target/release/clamp-bench}
PGSS=${PGSS:-1}
tag=${TAG:-request-cost}
for which in A B; do
  [ -x "${!which}" ] || { echo "bench-request-cost: $which=${!which} is not an executable" >&2; exit 1; }
done

need wrk wrk
need nginx nginx
need psql postgresql-client
if ! command -v initdb >/dev/null && ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
  [ -n "$bench_apt_updated" ] || apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi

now() { date +%s.%N; }

out=$(bench_out "$tag")
tmp=$(mktemp -d /tmp/bench-request-cost.XXXXXX)
chmod 755 "$tmp"  # nginx's workers run as nobody
pg_dir=$(mktemp -d /tmp/bench-request-cost-pg.XXXXXX)
server_pid='' wrk_pid='' nginx_pid='' mock_pid='' gen_pid=''
cleanup() {
  stop "$wrk_pid" "$gen_pid" "$server_pid" "$mock_pid" "$nginx_pid"
  scripts/dev-postgres.sh stop "$pg_dir" >/dev/null 2>&1 || true
  rm -rf "$tmp" "$pg_dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Postgres: a throwaway cluster with the settings of docs/configuration.md, pg_stat_statements loaded.
pg_port=$(free_port)
pg_extra=
[ "$PGSS" = 0 ] || pg_extra="shared_preload_libraries = 'pg_stat_statements'"
base=$(PG_EXTRA_CONF=$pg_extra scripts/dev-postgres.sh start "$pg_dir" "$pg_port"); base=${base%/clamp}
pg_cmd="PG_EXTRA_CONF=\"$pg_extra\" scripts/dev-postgres.sh start <tmpdir> <port>"
[ -n "$pg_extra" ] || pg_cmd="scripts/dev-postgres.sh start <tmpdir> <port>"
sql() { PGOPTIONS='-c client_min_messages=warning' psql "$base/postgres" -qAtX -v ON_ERROR_STOP=1 -c "$1"; }
pgss=0
if [ "$PGSS" != 0 ] && sql "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null 2>&1 \
  && sql "SELECT count(*) FROM pg_stat_statements" >/dev/null 2>&1; then
  pgss=1
else
  echo "bench-request-cost: pg_stat_statements unavailable; statements are n/a" >&2
fi
pg_set="$(pg_settings "$base"), $(sql "select string_agg(name || '=' || current_setting(name), ', ' order by name) from pg_settings where name in ('max_connections', 'shared_preload_libraries', 'server_version')")"
postmaster=$(head -1 "$pg_dir/postmaster.pid")
# CPU of this cluster alone: tree_ticks of its postmaster (scripts/bench-lib.sh).

# The downstream: nginx answering every path and method with a fixed JSON 200, in plain
# text and (on another port) over TLS with a certificate for localhost of a CA made here.
nginx_port=$(free_port)
nginx_tls_port=$(free_port)
mkdir -p "$tmp/nginx/logs"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj "/CN=bench CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign" \
  -keyout "$tmp/ca.key" -out "$tmp/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=localhost" \
  -keyout "$tmp/nginx/server.key" -out "$tmp/server.csr" 2>/dev/null
printf 'subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n' > "$tmp/server.ext"
openssl x509 -req -in "$tmp/server.csr" -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" -CAcreateserial -days 2 \
  -extfile "$tmp/server.ext" -out "$tmp/nginx/server.pem" 2>/dev/null
nginx_answer="location / { default_type application/json; return 200 '{\"ok\":true}'; }"
nginx_server="server { listen 127.0.0.1:$nginx_port; $nginx_answer }
  server { listen 127.0.0.1:$nginx_tls_port ssl; ssl_certificate $tmp/nginx/server.pem;
    ssl_certificate_key $tmp/nginx/server.key; ssl_session_cache shared:tls:10m; $nginx_answer }"
start_nginx "$tmp/nginx" "$nginx_server"
for _ in $(seq 1 50); do curl -sf -o /dev/null -X POST -d x "http://127.0.0.1:$nginx_port/a" && break; sleep 0.1; done
curl -sf -o /dev/null -X POST -d x "http://127.0.0.1:$nginx_port/a" \
  || { echo "bench-request-cost: nginx did not answer on 127.0.0.1:$nginx_port" >&2; cat "$tmp/nginx/logs/error.log" >&2; exit 1; }

port=$(free_port)
# The inputSchema of A_SCHEMA/B_SCHEMA: five properties of perf/wrk/create.lua's payload.
bench_schema='{"type":"object","required":["claimDetails","customer","policy"],"properties":{"claimDetails":{"type":"object","required":["amount","currency"],"properties":{"amount":{"type":"number","minimum":0},"currency":{"enum":["EUR","USD"]}}},"customer":{"type":"object","required":["id"]},"policy":{"type":"object"}}}'
workflow_for() {  # workflow_for A|B: the two-step workflow, over that side's scheme
  local scheme_var="${1}_SCHEME" base_url="http://127.0.0.1:$nginx_port"
  [ "${!scheme_var:-http}" = https ] && base_url="https://localhost:$nginx_tls_port"
  local conc_var="${1}_CONCURRENCY" extra=""
  [ -z "${!conc_var:-}" ] || extra=",\"concurrency\":${!conc_var}"
  local schema_var="${1}_SCHEMA"
  [ "${!schema_var:-0}" != 1 ] || extra="$extra,\"inputSchema\":$bench_schema"
  local notify_var="${1}_NOTIFY"
  [ "${!notify_var:-0}" != 1 ] || extra="$extra,\"notify\":[{\"on\":[\"COMPLETED\"],\"http\":{\"url\":\"$base_url/told\"}}]"
  echo "{\"name\":\"two\",\"description\":\"bench\"$extra,\"steps\":[{\"name\":\"a\",\"mode\":\"HTTP\",\"val\":{\"method\":\"POST\",\"url\":\"$base_url/a\"}},{\"name\":\"b\",\"mode\":\"HTTP\",\"val\":{\"method\":\"POST\",\"url\":\"$base_url/b\"}}]}"
}
# TOKEN: every call to the server carries it (servers started with tokens, e.g.
# SERVER_FLAGS="--api-tokens $TOKEN"); wrk reads it as BENCH_TOKEN (perf/wrk/create.lua).
auth=()
[ -z "${TOKEN:-}" ] || auth=(-H "Authorization: Bearer $TOKEN")
export BENCH_TOKEN="${TOKEN:-}"
# KEYS: each create's payload carries `"k"`, one of KEYS keys in turn (perf/wrk/create.lua
# reads it as BENCH_KEYS), for a side whose workflow declares a concurrency limit by it.
export BENCH_KEYS="${KEYS:-0}"
wrk_cmd="wrk -t1 -c$CONNS -d${DURATION}s -s perf/wrk/create.lua http://127.0.0.1:$port -- two"
# finished: completed + failed requests, by the server's counters (one /metrics read).
finished() {
  curl -s "${auth[@]}" "http://127.0.0.1:$port/metrics" | awk '$1 == "completed_service_request_handler_counter_total" {c = $2}
    $1 == "failed_service_request_handler_counter_total" {f = $2} END {printf "%d %d\n", c, f}'
}

side_flags() {  # side_flags A|B: that binary's own flags, nginx's URL put in
  local f="${1}_FLAGS" scheme="${1}_SCHEME"
  echo "${!f:-}" | sed "s#@NGINX@#http://127.0.0.1:$nginx_port#g"
  [ "${!scheme:-http}" != https ] || echo "--step-ca-file $tmp/ca.pem"
}
start_server() {  # start_server BINARY DB LOG [A|B]: starts it on $port and waits for /health
  # SERVER_FLAGS and the side's flags are split into words on purpose.
  # shellcheck disable=SC2086
  serve "$port" "$3" "$1" --port "$port" --bind 127.0.0.1 --database-url "$base/$2" ${SERVER_FLAGS:-} $(side_flags "${4:-X}")
}
stop_server() {
  stop "$server_pid"
  server_pid=
}

: > "$tmp/rows"
for round in $(seq 1 "$ROUNDS"); do
  for which in $(ab_order "$round"); do
    bin=${!which}
    db=clamp_reqcost_${round}_${which,,}
    sql "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
    start_server "$bin" "$db" "$tmp/server-$round-$which.log" "$which"
    code=$(curl -s "${auth[@]}" -o "$tmp/workflow.json" -w '%{http_code}' -X POST -H 'Content-Type: application/json' \
      -d "$(workflow_for "$which")" "http://127.0.0.1:$port/workflow")
    case "$code" in 2??) ;; *) echo "bench-request-cost: POST /workflow answered $code: $(cat "$tmp/workflow.json")" >&2; exit 1 ;; esac
    seed_var="${which}_SEED"
    seed=${!seed_var:-$SEED}
    if [ "$seed" -gt 0 ]; then
      # SEED requests waiting in the table: half asleep at a WAIT (due in a day), half
      # paused at an EVENT, a quarter with a deadline a day ahead; then analyzed. Their
      # ids are UUIDv7 of now (the table is partitioned by id: a random UUID has no
      # partition).
      # (A binary from before deadlines has no such column: its rows get none.)
      dl_col= dl_val=
      if [ -n "$(psql "$base/$db" -qAt -c "SELECT 1 FROM information_schema.columns
          WHERE table_name = 'service_requests' AND column_name = 'deadline'")" ]; then
        dl_col=", deadline" dl_val=", CASE WHEN g % 4 < 2 THEN now() + interval '1 day' END"
      fi
      psql "$base/$db" -qAt -v ON_ERROR_STOP=1 -c "INSERT INTO service_requests
          (id, workflow_name, payload, headers, status, current_step_id, step_attempts,
           lease_until, wait_event, wait_key $dl_col)
        SELECT (lpad(to_hex(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0')
                || '7' || substr(md5(g::text), 1, 3) || '8' || substr(md5(g::text), 4, 15))::uuid,
               'two', '{}', '[]',
               CASE WHEN g % 2 = 0 THEN 'NEW' ELSE 'PAUSED' END, 1, g % 2,
               CASE WHEN g % 2 = 0 THEN now() + interval '1 day' ELSE '-infinity' END,
               CASE WHEN g % 2 = 1 THEN 'seed.approved' END, CASE WHEN g % 2 = 1 THEN g::text END
               $dl_val
        FROM generate_series(1, $seed) g" -c "VACUUM ANALYZE service_requests" >/dev/null
    fi
    sql_var="${which}_SQL"
    if [ -n "${!sql_var:-}" ]; then
      psql "$base/$db" -qAt -v ON_ERROR_STOP=1 -c "${!sql_var}" >/dev/null
    fi
    restart_var="${which}_RESTART"
    if [ "${!restart_var:-0}" = 1 ]; then
      # The server started again on what its SQL made of the database (a statement cached
      # against the tables the SQL replaced is not what is priced).
      stop_server
      start_server "$bin" "$db" "$tmp/server-$round-$which-again.log" "$which"
    fi
    sleep 1
    [ "$pgss" = 0 ] || sql "SELECT pg_stat_statements_reset()" >/dev/null
    # The tables and indexes report counts this run only (not the seeding, nor migrations).
    psql "$base/$db" -qAt -c "SELECT pg_stat_reset()" >/dev/null
    commits0=$(sql "SELECT xact_commit FROM pg_stat_database WHERE datname = '$db'")
    lsn0=$(sql "SELECT pg_current_wal_lsn()")
    created0=$(metric "$port" 'create_service_request_handler_counter_total{status="2xx"}')
    s0=$(proc_ticks "$server_pid"); p0=$(tree_ticks "$postmaster"); n0=$(tree_ticks "$nginx_pid")
    t0=$(now)
    $wrk_cmd > "$tmp/wrk-$round-$which.txt" 2>&1 &
    wrk_pid=$!
    wait "$wrk_pid"
    wrk_pid=
    t_wrk=$(now)
    created=$(( $(metric "$port" 'create_service_request_handler_counter_total{status="2xx"}') - created0 ))
    # Every created request completed (or failed): the server's own counters, read over HTTP
    # (no query on the measured database).
    timed_out=0
    give_up=$((SECONDS + DEADLINE))
    notify_var="${which}_NOTIFY"
    while :; do
      read -r done_ failed < <(finished)
      if [ $((done_ + failed)) -ge "$created" ]; then
        # A side that tells: its round ends when every COMPLETED is told too.
        [ "${!notify_var:-0}" != 1 ] && break
        told=$(metric "$port" 'clamp_notifications_total{outcome="delivered"}')
        [ "${told%.*}" -ge "$done_" ] && break
      fi
      if [ "$SECONDS" -ge "$give_up" ]; then timed_out=1; break; fi
      sleep 0.05
    done
    t1=$(now)
    s1=$(proc_ticks "$server_pid"); p1=$(tree_ticks "$postmaster"); n1=$(tree_ticks "$nginx_pid")
    wal=$(sql "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '$lsn0')::bigint")
    # Spans (zero unless the side traces): exported, dropped at the full queue, failed.
    echo "$round $which $(metric "$port" clamp_trace_spans_exported_total) $(metric "$port" clamp_trace_spans_dropped_total) $(metric "$port" clamp_trace_spans_failed_total)" >> "$tmp/spans"
    # The backends flush their pending counters when the server's connections close.
    stop_server
    sleep 0.5
    commits=$(( $(sql "SELECT xact_commit FROM pg_stat_database WHERE datname = '$db'") - commits0 ))
    dbid="(SELECT oid FROM pg_database WHERE datname = '$db')"
    stmts=n/a
    if [ "$pgss" = 1 ]; then
      stmts=$(sql "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements WHERE dbid = $dbid")
      psql "$base/postgres" -qAtX -v ON_ERROR_STOP=1 -F $'\x1f' -c "SELECT calls, rows, total_exec_time,
          regexp_replace(query, '\s+', ' ', 'g') FROM pg_stat_statements
          WHERE dbid = $dbid ORDER BY total_exec_time DESC LIMIT 15" > "$tmp/stmts-$which.txt"
      echo "$round" > "$tmp/stmts-$which.round"
      echo "$done_" > "$tmp/stmts-$which.completed"
    fi
    # Where the writes went (the last round of each binary is reported): per table,
    # inserts, updates and HOT updates; per index (partitions summed into their parent),
    # scans and buffer touches (reads and maintenance alike), and its size.
    psql "$base/$db" -qAtX -v ON_ERROR_STOP=1 -F ' ' -c "SELECT
        coalesce(pg_partition_root(relid), relid)::regclass::text, sum(n_tup_ins)::bigint,
        sum(n_tup_upd)::bigint, sum(n_tup_hot_upd)::bigint, sum(n_tup_del)::bigint
      FROM pg_stat_user_tables GROUP BY 1 HAVING sum(n_tup_ins + n_tup_upd + n_tup_del) > 0
      ORDER BY 3 DESC" > "$tmp/hot-$which.txt"
    psql "$base/$db" -qAtX -v ON_ERROR_STOP=1 -F ' ' -c "SELECT
        coalesce(pg_partition_root(s.indexrelid), s.indexrelid)::regclass::text,
        sum(s.idx_scan)::bigint, sum(io.idx_blks_hit + io.idx_blks_read)::bigint,
        sum(pg_relation_size(s.indexrelid))::bigint
      FROM pg_stat_user_indexes s JOIN pg_statio_user_indexes io USING (indexrelid)
      GROUP BY 1 HAVING sum(io.idx_blks_hit + io.idx_blks_read) > 0 ORDER BY 3 DESC" > "$tmp/idx-$which.txt"
    echo "$round $done_" > "$tmp/hot-$which.round"
    read -r failed_db open_db < <(psql "$base/$db" -qAtX -F ' ' -c \
      "SELECT count(*) FILTER (WHERE status = 'FAILED'), count(*) FILTER (WHERE status NOT IN ('COMPLETED', 'FAILED')) FROM service_requests")
    open_db=$((open_db - seed))  # the seeded requests wait on purpose
    sql "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
    echo "$round $which $created $done_ $failed $failed_db $open_db $timed_out $t0 $t_wrk $t1 $((s1 - s0)) $((p1 - p0)) $((n1 - n0)) $wal $commits $stmts $tmp/wrk-$round-$which.txt" >> "$tmp/rows"
    python3 - "$(tail -1 "$tmp/rows")" <<'PY'
import re, sys
sys.path.insert(0, 'scripts')
from benchmath import cpu_per, ratio, wrk
r = sys.argv[1].split()
rnd, which, created, done, failed, failed_db, open_db, timed_out = r[0], r[1], *map(int, r[2:8])
t0, t_wrk, t1 = map(float, r[8:11])
s, p, n, wal, commits = map(int, r[11:16])
stmts = r[16]
rate = wrk(open(r[17]).read())[0]
per = lambda x: ratio(x, done)
st = f'{per(int(stmts)):.3f}' if stmts != 'n/a' else 'n/a'
print(f'round {rnd} {which}: {rate:,.0f} creates/s, {done:,} completed in {t1 - t0:.1f} s = {ratio(done, t1 - t0):,.0f}/s; '
      f'per completed: server {cpu_per(s, done):.1f} µs, Postgres {cpu_per(p, done):.1f} µs, WAL {per(wal):,.0f} B, '
      f'{per(commits):.3f} commits, {st} statements')
if failed or failed_db:
    print(f'WARNING: round {rnd} {which}: {max(failed, failed_db)} requests FAILED', file=sys.stderr)
if timed_out or open_db:
    print(f'WARNING: round {rnd} {which}: not all created requests completed ({open_db} unfinished rows; waited past the deadline: {bool(timed_out)})', file=sys.stderr)
PY
  done
done

# Clients that poll (as scripts/bench-poll.sh): once per binary, alternating.
: > "$tmp/poll-rows"
poll_note=
gen_cmd=
mock_cmd=
if [ "$POLL" = 0 ]; then
  poll_note="skipped (POLL=0)"
elif [ ! -x "$BENCH_BIN" ]; then
  poll_note="skipped ($BENCH_BIN not built: cargo build --release -p clamp-bench)"
else
  mock_port=$(free_port)
  mock_cmd="$BENCH_BIN mock --port $mock_port --threads 1"
  $mock_cmd > /dev/null 2>&1 &
  mock_pid=$!
  gen_cmd="$BENCH_BIN e2e --url http://127.0.0.1:$port --downstream http://127.0.0.1:$mock_port -c $POLL_CONNS -t 2 -d ${POLL_DURATION}s --warmup 2s -q --timeout 10s --poll-interval $POLL_INTERVAL"
  for round in $(seq 1 "$POLL_ROUNDS"); do
    for which in $(ab_order "$round"); do
      db=clamp_reqcost_poll_${round}_${which,,}
      sql "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
      start_server "${!which}" "$db" "$tmp/server-poll-$round-$which.log" "$which"
      read -r c0 f0 < <(finished)
      s0=$(proc_ticks "$server_pid"); p0=$(tree_ticks "$postmaster")
      $gen_cmd --json "$tmp/poll-$round-$which.json" > /dev/null &
      gen_pid=$!
      wait "$gen_pid"
      gen_pid=
      s1=$(proc_ticks "$server_pid"); p1=$(tree_ticks "$postmaster")
      read -r c1 f1 < <(finished)
      stop_server
      sql "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
      echo "$round $which $((s1 - s0)) $((p1 - p0)) $((c1 + f1 - c0 - f0)) $tmp/poll-$round-$which.json" >> "$tmp/poll-rows"
      echo "poll round $round $which: $(python3 -c "import json; j = json.load(open('$tmp/poll-$round-$which.json')); print(round((j.get('e2e') or {}).get('completed_rate') or j['achieved_rate']), 'completed/s')")"
    done
  done
  kill "$mock_pid" 2>/dev/null || true; wait "$mock_pid" 2>/dev/null || true; mock_pid=
  poll_note="server \`<binary> --port $port --bind 127.0.0.1 --database-url $base/<fresh db per run>${SERVER_FLAGS:+ $SERVER_FLAGS}\`; mock \`$mock_cmd\`; generator \`$gen_cmd --json <file>\`"
fi

server_cmd="<binary> --port $port --bind 127.0.0.1 --database-url $base/<fresh db per run>${SERVER_FLAGS:+ $SERVER_FLAGS}"
git_head="$(git rev-parse --short HEAD 2>/dev/null || echo none)"
[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || git_head="$git_head (working tree with uncommitted changes)"
export RC_AFLAGS="$(side_flags A | xargs)" RC_BFLAGS="$(side_flags B | xargs)"
export RC_A=$A RC_B=$B RC_GIT=$git_head RC_PG="$pg_set" RC_PGCMD="$pg_cmd" RC_SERVER="$server_cmd" \
  RC_WRK="$wrk_cmd" RC_WORKFLOW="A: $(workflow_for A); B: $(workflow_for B)" RC_NGINX="$nginx_server" RC_POLLNOTE="$poll_note" \
  RC_PGSS=$pgss RC_TMP=$tmp RC_ROUNDS=$ROUNDS RC_SEED="${A_SEED:-$SEED}/${B_SEED:-$SEED}" RC_ASQL="${A_SQL:-}" RC_BSQL="${B_SQL:-}" RC_ARESTART="${A_RESTART:-0}" RC_BRESTART="${B_RESTART:-0}" RC_DURATION=$DURATION RC_DEADLINE=$DEADLINE \
  RC_POLLDUR=$POLL_DURATION RC_POLLCONNS=$POLL_CONNS RC_POLLINT=$POLL_INTERVAL
python3 - "$out/$tag.md" <<'PY'
import datetime, hashlib, json, os, socket, sys
sys.path.insert(0, 'scripts')
from benchmath import cpu_per, median, ratio as div, wrk as wrk_figures
E = os.environ
tmp = E['RC_TMP']
path = sys.argv[1]

def sha(p):
    h = hashlib.sha256()
    with open(p, 'rb') as f:
        for b in iter(lambda: f.read(1 << 20), b''):
            h.update(b)
    return h.hexdigest()[:12]

def cpu_model():
    for line in open('/proc/cpuinfo'):
        if line.startswith('model name'):
            return line.split(':', 1)[1].strip()
    return 'unknown'

def med(xs):
    xs = [x for x in xs if x is not None]
    return median(xs) if xs else None

def fmt(x, spec):
    return 'n/a' if x is None else format(x, spec)

runs = []
for line in open(f'{tmp}/rows'):
    r = line.split()
    created, done, failed, failed_db, open_db, timed_out = map(int, r[2:8])
    t0, t_wrk, t1 = map(float, r[8:11])
    s, p, n, wal, commits = map(int, r[11:16])
    rate, non2xx, _ = wrk_figures(open(r[17]).read())
    per = lambda x: div(x, done) if done else None
    cpu = lambda ticks: cpu_per(ticks, done) if done else None
    runs.append(dict(
        round=int(r[0]), which=r[1], creates=rate, non2xx=non2xx,
        created=created, done=done, failed=max(failed, failed_db), open=open_db, timed_out=timed_out,
        after=t1 - t_wrk, secs=t1 - t0, rate=div(done, t1 - t0),
        server=cpu(s), pg=cpu(p), both=cpu(s + p), nginx=cpu(n),
        wal=per(wal), commits=per(commits), stmts=None if r[16] == 'n/a' else per(int(r[16]))))

cols = [('completed/s', 'rate', ',.0f'), ('creates/s (wrk)', 'creates', ',.0f'),
        ('server µs', 'server', '.1f'), ('Postgres µs', 'pg', '.1f'), ('server + Postgres µs', 'both', '.1f'),
        ('nginx µs', 'nginx', '.1f'), ('WAL bytes', 'wal', ',.0f'), ('commits', 'commits', '.3f'),
        ('statements', 'stmts', '.3f')]
medians = {w: {k: med(x[k] for x in runs if x['which'] == w) for _, k, _ in cols} for w in 'AB'}

o = []
w = o.append
w('# What one completed two-step request costs, A against B\n')
w(f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%SZ}, host {socket.gethostname()}, "
  f"nproc {os.cpu_count()}, {cpu_model()}")
w(f"- git HEAD of the tree the script ran in: {E['RC_GIT']}")
w(f"- A: `{E['RC_A']}` (sha256 {sha(E['RC_A'])}){' with `' + E['RC_AFLAGS'] + '`' if E['RC_AFLAGS'] else ''}; "
  f"B: `{E['RC_B']}` (sha256 {sha(E['RC_B'])}){' with `' + E['RC_BFLAGS'] + '`' if E['RC_BFLAGS'] else ''}")
w(f"- Postgres: throwaway cluster, `{E['RC_PGCMD']}` (the settings of docs/configuration.md): {E['RC_PG']}"
  + ("; pg_stat_statements loaded (its cost is in Postgres CPU, alike for both)" if E['RC_PGSS'] == '1' else '; no pg_stat_statements'))
w(f"- downstream: nginx 127.0.0.1, `worker_processes 1; access_log off;` and `{E['RC_NGINX']}`")
w(f"- server: `{E['RC_SERVER']}`; then `POST /workflow` with `{E['RC_WORKFLOW']}`")
w(f"- load: `{E['RC_WRK']}`, then a wait (up to {E['RC_DEADLINE']} s) until the server's "
  "`completed_service_request_handler_counter_total` + `failed_…` reach its count of created requests "
  "(`create_service_request_handler_counter_total{status=\"2xx\"}`)")
w(f"- rounds: {E['RC_ROUNDS']}, A then B in odd rounds, B then A in even ones, each run on a fresh database; "
  "server, Postgres, nginx and wrk share the machine")
for side in 'AB':
    if E[f'RC_{side}SQL']:
        again = ", then its server stopped and started again" if E[f'RC_{side}RESTART'] == '1' else ""
        w(f"- {side}'s database, once migrated and before the load: `{E[f'RC_{side}SQL']}`{again}")
seeds = [int(x) for x in E['RC_SEED'].split('/')]
if any(seeds):
    w(f"- waiting: A {seeds[0]:,}, B {seeds[1]:,} requests inserted before each run (half asleep at a WAIT due in a day, "
      "half paused at an EVENT, half of all with a deadline a day ahead where the binary has deadlines), then `VACUUM ANALYZE service_requests`")
w('- per completed request, from wrk\'s start to the moment the last request completed: server CPU '
  '(`/proc/<pid>/stat`), Postgres CPU (the postmaster with its children, live and reaped: this cluster only), '
  'nginx CPU likewise, WAL (`pg_wal_lsn_diff`), commits (`pg_stat_database.xact_commit` of the database, '
  'read after the server closed its connections), statements (`pg_stat_statements` calls of the database, '
  'utility statements such as BEGIN and COMMIT counted too); completed/s = completed ÷ that time\n')
w('| round | binary | creates/s (wrk) | non-2xx | created | completed | FAILED | s after wrk | completed/s | server µs | Postgres µs | server + Postgres µs | nginx µs | WAL bytes | commits | statements |')
w('|' + '---|' * 16)
for x in runs:
    w(f"| {x['round']} | {x['which']} | {x['creates']:,.0f} | {x['non2xx']} | {x['created']:,} | {x['done']:,} | {x['failed']} | "
      f"{x['after']:.1f} | {x['rate']:,.0f} | {fmt(x['server'], '.1f')} | {fmt(x['pg'], '.1f')} | {fmt(x['both'], '.1f')} | "
      f"{fmt(x['nginx'], '.1f')} | {fmt(x['wal'], ',.0f')} | {fmt(x['commits'], '.3f')} | {fmt(x['stmts'], '.3f')} |")
warn = [x for x in runs if x['failed'] or x['open'] or x['timed_out']]
for x in warn:
    w(f"\n**Warning**: round {x['round']} {x['which']}: {x['failed']} FAILED, {x['open']} unfinished rows, "
      f"deadline passed: {bool(x['timed_out'])}")
w('\nMedians per binary (per completed request):\n')
w('| binary | ' + ' | '.join(c for c, _, _ in cols) + ' |')
w('|' + '---|' * (len(cols) + 1))
for b in 'AB':
    w(f'| {b} | ' + ' | '.join(fmt(medians[b][k], f) for _, k, f in cols) + ' |')
ratio = lambda k: div(medians['B'][k], medians['A'][k]) if medians['A'][k] and medians['B'][k] is not None else None
w('| B ÷ A | ' + ' | '.join(fmt(ratio(k), '.3f') for _, k, _ in cols) + ' |')
w(f"\n**B ÷ A of the medians: completed/s {fmt(ratio('rate'), '.3f')}, "
  f"server + Postgres CPU µs per completed request {fmt(ratio('both'), '.3f')}.**")
# Each round's own pair (its two runs minutes apart): on a host whose speed drifts through
# the run, the median of these is the steadier figure.
pairs = {}
for x in runs:
    pairs.setdefault(x['round'], {})[x['which']] = x
pair = lambda k: [div(r['B'][k], r['A'][k]) for r in pairs.values()
                  if 'A' in r and 'B' in r and r['A'][k] and r['B'][k] is not None]
w(f"\nEach round's B ÷ A: completed/s {', '.join(format(v, '.3f') for v in pair('rate'))}; "
  f"CPU per completed request {', '.join(format(v, '.3f') for v in pair('both'))}; "
  f"**their medians {fmt(med(pair('rate')), '.3f')} and {fmt(med(pair('both')), '.3f')}**.")

if E['RC_PGSS'] == '1':
    for b in 'AB':
        f = f'{tmp}/stmts-{b}.txt'
        if not os.path.exists(f):
            continue
        done = int(open(f'{tmp}/stmts-{b}.completed').read())
        rnd = open(f'{tmp}/stmts-{b}.round').read().strip()
        w(f'\nStatements of {b} (round {rnd}, {done:,} completed), by execution time:\n')
        w('| calls per completed | rows per call | execution µs (elapsed) per completed | µs per call | statement |')
        w('|---|---|---|---|---|')
        for line in open(f):
            calls, rows, ms, q = line.rstrip('\n').split('\x1f', 3)
            calls, rows, ms = int(calls), int(rows), float(ms)
            q = q.strip()
            q = (q[:80] + '…') if len(q) > 80 else q
            q = q.replace('|', '\\|').replace('`', "'")
            w(f"| {calls / done:.3f} | {rows / calls if calls else 0:.1f} | {ms * 1e3 / done:.2f} | "
              f"{ms * 1e3 / calls if calls else 0:.1f} | `{q}` |")

for b in 'AB':
    f = f'{tmp}/hot-{b}.txt'
    if not os.path.exists(f):
        continue
    rnd, done = open(f'{tmp}/hot-{b}.round').read().split()
    done = int(done)
    w(f'\nTables of {b} (round {rnd}, {done:,} completed): rows written per completed request, '
      'and the share of updates that were HOT (no index entry written):\n')
    w('| table | inserts | updates | HOT updates | HOT ratio | deletes |')
    w('|---|---|---|---|---|---|')
    for line in open(f):
        t, ins, upd, hot, dele = line.split()
        ins, upd, hot, dele = int(ins), int(upd), int(hot), int(dele)
        w(f"| {t} | {ins / done:.3f} | {upd / done:.3f} | {hot / done:.3f} | "
          f"{(hot / upd if upd else 0):.3f} | {dele / done:.3f} |")
    w(f'\nIndexes of {b} (round {rnd}; partitions summed into their parent): scans and buffer '
      'touches (reads and maintenance) per completed request, and size:\n')
    w('| index | scans | buffers touched | MB |')
    w('|---|---|---|---|')
    for line in open(f'{tmp}/idx-{b}.txt'):
        i, scans, blks, size = line.split()
        w(f"| {i} | {int(scans) / done:.3f} | {int(blks) / done:.2f} | {int(size) / 1e6:.1f} |")

w(f"\n## Clients that poll ({E['RC_POLLCONNS']} users, {E['RC_POLLINT']} between reads, {E['RC_POLLDUR']} s, as scripts/bench-poll.sh)\n")
w(f"- {E['RC_POLLNOTE']}")
prow = [l.split() for l in open(f'{tmp}/poll-rows') if l.strip()]
if prow:
    w("- completed/s, completed, errors and latencies: the generator's (after its warm-up); CPU per completed: "
      "server and Postgres CPU over the whole run ÷ the requests the server finished in it (its counters)\n")
    w('| round | binary | completed/s | completed | errors | end-to-end p50 ms | p99 ms | server µs per completed | Postgres µs per completed |')
    w('|---|---|---|---|---|---|---|---|---|')
    prates = {'A': [], 'B': []}
    for rnd, b, s, p, fin, js in prow:
        j = json.load(open(js))
        e2e = j.get('e2e') or {}
        rate = e2e.get('completed_rate') or j['achieved_rate']
        done = e2e.get('completed') or j.get('ok') or 0
        prates[b].append(rate)
        lat = j['latency_us']
        per = lambda t: f'{cpu_per(t, fin):.1f}' if int(fin) else 'n/a'
        w(f"| {rnd} | {b} | {rate:,.0f} | {done:,} | {sum(j.get('errors', {}).values())} | {lat['p50'] / 1000:.1f} | "
          f"{lat['p99'] / 1000:.1f} | {per(s)} | {per(p)} |")
    if prates['A'] and prates['B']:
        ma, mb = median(prates['A']), median(prates['B'])
        w(f'\nPolling completed/s, medians: A {ma:,.0f}, B {mb:,.0f}, B ÷ A {div(mb, ma):.3f}')
if os.path.exists(f'{tmp}/spans'):
    rows = [l.split() for l in open(f'{tmp}/spans')]
    if any(int(x) for r in rows for x in r[2:]):
        w('\n## Spans (the server\'s counters at the end of each run)\n')
        w('| round | binary | exported | dropped (queue full) | failed exports |')
        w('|---|---|---|---|---|')
        for r in rows:
            w(f'| {r[0]} | {r[1]} | {int(r[2]):,} | {int(r[3]):,} | {int(r[4]):,} |')
open(path, 'w').write('\n'.join(o) + '\n')
PY
cat "$out/$tag.md"
