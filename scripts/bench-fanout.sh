#!/usr/bin/env bash
# What fan-out costs per step call: one server binary, a throwaway Postgres with the settings
# of docs/configuration.md, and nginx as the downstream (a fixed JSON 200, as in
# scripts/bench-request-cost.sh, plus two fixed lists). Per round, in rotating order, each
# on a fresh database with a fresh server:
#   linear   the two-step workflow (two HTTP steps): 2 step calls per request
#   parallel a PARALLEL step of 8 branches, one HTTP step each: 8 step calls (run as lanes
#            of the request, no children; a binary from before lanes makes 8 children, which
#            the run detects once its creates are answered)
#   map      an HTTP step `list` (GET, a list of 100 numbers) then a MAP over
#            `list.response.items`, maxConcurrency 16, one HTTP step per item: 101 step
#            calls, 100 children
# Each run creates a fixed number of requests, CALLS ÷ the workflow's step calls per request
# (so every run asks nginx for about CALLS step calls), by `wrk -t1 -c$CONNS` of creates
# (perf/wrk/create.lua, stopped once that many are answered; a create refused is counted,
# not sent again), then waits until the server's completed + failed + cancelled counters
# reach the requests created plus their children. Per run, from wrk's start to that
# moment: step calls/s (nginx's request count, from its stub_status, ÷ the time), and per
# step call server CPU, Postgres CPU (this cluster's processes), WAL bytes and statements
# (pg_stat_statements, with the last round's ten costliest per workflow); per workflow the
# medians, and each fan-out's step calls/s ÷ the linear workflow's. Then (BIG=0 skips it)
# one MAP of BIG_ITEMS (10,000) items, maxConcurrency 16: time from create to COMPLETED and
# the server's VmHWM before and after. A run that does not finish in DEADLINE s, with a
# FAILED or CANCELLED request or with a create refused leaves its server log
# (<tag>-server-<round>-<workflow>.log), the rows by status, the joins not done and the
# GET /serviceRequest/{id} answers of some unfinished parents and children in the record
# folder (<tag>-diag-<round>-<workflow>.txt).
# Writes perf/runs/<date>-<host>/<commit>-<tag>/<tag>.md.
#
#   BIN=/tmp/head/target/release/clamp scripts/bench-fanout.sh
#   ROUNDS=1 CALLS=4000 BIG_ITEMS=1000 TAG=fanout-try BIN=… scripts/bench-fanout.sh
#
# Settings: BIN (target/release/clamp), ROUNDS (3), CALLS (30000, step calls per run),
# CONNS (16, wrk's connections), DEADLINE (180, seconds from the first create for a run to
# finish), BIG (1), BIG_ITEMS (10000), BIG_DEADLINE (300), PGSS (1; 0 runs Postgres without
# pg_stat_statements), SERVER_FLAGS, TAG (fanout).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
BIN=${BIN:-target/release/clamp}
ROUNDS=${ROUNDS:-3}
CALLS=${CALLS:-30000}
CONNS=${CONNS:-16}
DEADLINE=${DEADLINE:-180}
BIG=${BIG:-1}
BIG_ITEMS=${BIG_ITEMS:-10000}
BIG_DEADLINE=${BIG_DEADLINE:-300}
PGSS=${PGSS:-1}
tag=${TAG:-fanout}
[ -x "$BIN" ] || { echo "bench-fanout: BIN=$BIN is not an executable" >&2; exit 1; }

need wrk wrk
need nginx nginx
need psql postgresql-client
if ! command -v initdb >/dev/null && ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
  [ -n "$bench_apt_updated" ] || apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi

now() { date +%s.%N; }

out=$(bench_out "$tag")
tmp=$(mktemp -d /tmp/bench-fanout.XXXXXX)
chmod 755 "$tmp"  # nginx's workers run as nobody
pg_dir=$(mktemp -d /tmp/bench-fanout-pg.XXXXXX)
server_pid='' wrk_pid='' nginx_pid=''
cleanup() {
  stop "$wrk_pid" "$server_pid" "$nginx_pid"
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
sql() { PGOPTIONS='-c client_min_messages=warning' psql "$base/postgres" -qAtX -v ON_ERROR_STOP=1 -c "$1"; }
pgss=0
if [ "$PGSS" != 0 ] && sql "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null 2>&1 \
  && sql "SELECT count(*) FROM pg_stat_statements" >/dev/null 2>&1; then
  pgss=1
else
  echo "bench-fanout: pg_stat_statements unavailable; statements are n/a" >&2
fi
dbsql() { PGOPTIONS='-c client_min_messages=warning' psql "$base/$1" -qAtX -F ' ' -v ON_ERROR_STOP=1 -c "$2"; }
pg_set="$(pg_settings "$base"), $(sql "select string_agg(name || '=' || current_setting(name), ', ' order by name) from pg_settings where name in ('max_connections', 'server_version')")"
postmaster=$(head -1 "$pg_dir/postmaster.pid")

# The downstream: nginx answering POST on every path with a fixed JSON 200, GET /list100
# and GET /list10k with {"items":[0, …, n-1]} (static files: a string that long does not fit
# nginx's configuration), and its request count on another port (stub_status).
nginx_port=$(free_port)
status_port=$(free_port)
mkdir -p "$tmp/nginx/logs" "$tmp/nginx/www"
python3 -c "import json; json.dump({'items': list(range(100))}, open('$tmp/nginx/www/list100.json', 'w'))"
python3 -c "import json; json.dump({'items': list(range($BIG_ITEMS))}, open('$tmp/nginx/www/listbig.json', 'w'))"
chmod -R a+rX "$tmp/nginx/www"
nginx_server="server { listen 127.0.0.1:$nginx_port;
    location / { default_type application/json; return 200 '{\"ok\":true}'; }
    location = /list100 { default_type application/json; alias $tmp/nginx/www/list100.json; }
    location = /listbig { default_type application/json; alias $tmp/nginx/www/listbig.json; } }
  server { listen 127.0.0.1:$status_port; location = /status { stub_status; } }"
start_nginx "$tmp/nginx" "$nginx_server"
for _ in $(seq 1 50); do curl -sf -o /dev/null -X POST -d x "http://127.0.0.1:$nginx_port/a" && break; sleep 0.1; done
curl -sf -o /dev/null "http://127.0.0.1:$nginx_port/list100" \
  || { echo "bench-fanout: nginx did not answer on 127.0.0.1:$nginx_port" >&2; cat "$tmp/nginx/logs/error.log" >&2; exit 1; }
# nginx_requests: every request nginx has read so far (this read included).
nginx_requests() { curl -s "http://127.0.0.1:$status_port/status" | awk 'NR == 3 {print $3}'; }

n="http://127.0.0.1:$nginx_port"
http_step() { echo "{\"name\":\"$1\",\"mode\":\"HTTP\",\"val\":{\"method\":\"${3:-POST}\",\"url\":\"$n$2\"}}"; }
branches=$(for i in 1 2 3 4 5 6 7 8; do printf '%s{"name":"b%d","steps":[%s]}' "$([ "$i" = 1 ] || echo ,)" "$i" "$(http_step s /p)"; done)
map_of() {  # map_of NAME LIST_PATH: the list step, then a MAP of one HTTP step over its items
  echo "{\"name\":\"$1\",\"description\":\"bench\",\"steps\":[$(http_step list "$2" GET),{\"name\":\"each\",\"mode\":\"MAP\",\"val\":{\"items\":\"list.response.items\",\"maxConcurrency\":16,\"steps\":[$(http_step s /m)]}}]}"
}
declare -A def calls children
def[linear]="{\"name\":\"linear\",\"description\":\"bench\",\"steps\":[$(http_step a /a),$(http_step b /b)]}"
def[parallel]="{\"name\":\"parallel\",\"description\":\"bench\",\"steps\":[{\"name\":\"fan\",\"mode\":\"PARALLEL\",\"val\":{\"branches\":[$branches]}}]}"
def[map]=$(map_of map /list100)
def[big]=$(map_of big /listbig)
calls[linear]=2 calls[parallel]=8 calls[map]=101 calls[big]=$((BIG_ITEMS + 1))
children[linear]=0 children[parallel]=8 children[map]=100 children[big]=$BIG_ITEMS
workflows=(linear parallel map)

# wrk's script: perf/wrk/create.lua for the first N requests (wrk's second argument), then
# GET /health; once the N creates are answered (any status: a create refused is counted and
# reported, not sent again) it makes the file named by its third argument and stops its
# thread, and wrk is interrupted: no create is left in flight on a connection wrk drops.
cat > "$tmp/create-n.lua" <<'EOF'
dofile("perf/wrk/create.lua")
local base_init, limit, flag, sent, answered = init, 0, nil, 0, 0
local create_req, health_req, probed
function init(args)
  base_init(args)
  limit, flag = tonumber(args[2]) or 0, args[3]
  create_req = wrk.format()
  health_req = wrk.format("GET", "/health", {}, nil)
end
function request()
  -- wrk calls it once after init to check the script (thread 0, the only one): not sent.
  if not probed then probed = true; return create_req end
  sent = sent + 1
  if sent <= limit then return create_req end
  return health_req
end
function response(status, headers, body)
  if body == '{"status":"UP"}' then return end
  answered = answered + 1
  if answered == limit then
    if flag then io.open(flag, "w"):close() end
    wrk.thread:stop()
  end
end
EOF

port=$(free_port)
# shellcheck disable=SC2086  # SERVER_FLAGS is split into words on purpose
start_server() { serve "$port" "$2" "$BIN" --port "$port" --bind 127.0.0.1 --database-url "$base/$1" ${SERVER_FLAGS:-}; }
put_workflow() {
  local code
  code=$(curl -s -o "$tmp/workflow.json" -w '%{http_code}' -X POST -H 'Content-Type: application/json' \
    -d "${def[$1]}" "http://127.0.0.1:$port/workflow")
  case "$code" in 2??) ;; *) echo "bench-fanout: POST /workflow $1 answered $code: $(cat "$tmp/workflow.json")" >&2; exit 1 ;; esac
}
# counts: completed, failed and cancelled requests (parents and children) and creates
# answered 2xx, the server's counters (one /metrics read).
counts() {
  curl -s "http://127.0.0.1:$port/metrics" | awk '
    $1 == "completed_service_request_handler_counter_total" {c = $2}
    $1 == "failed_service_request_handler_counter_total" {f = $2}
    $1 == "cancelled_service_request_handler_counter_total" {x = $2}
    $1 == "create_service_request_handler_counter_total{status=\"2xx\"}" {n = $2}
    END {printf "%d %d %d %d\n", c, f, x, n}'
}
# stmts_at_end: the statements of database $db so far (pg_stat_statements, reset at the
# run's start; n/a without it) into stmts, and its ten first by execution time into
# $tmp/stmts-$wf.txt (the last round's are kept for the record).
stmts_at_end() {
  stmts=n/a
  [ "$pgss" = 1 ] || return 0
  local dbid="(SELECT oid FROM pg_database WHERE datname = '$db')"
  stmts=$(sql "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements WHERE dbid = $dbid")
  psql "$base/postgres" -qAtX -v ON_ERROR_STOP=1 -F $'\x1f' -c "SELECT calls, rows, total_exec_time,
      regexp_replace(query, '\s+', ' ', 'g') FROM pg_stat_statements
      WHERE dbid = $dbid ORDER BY total_exec_time DESC LIMIT 10" > "$tmp/stmts-$wf.txt"
}
created_now() { metric "$port" 'create_service_request_handler_counter_total{status="2xx"}'; }
# refused_now: creates answered other than 2xx (4xx, 5xx, other), the server's counters.
refused_now() {
  curl -s "http://127.0.0.1:$port/metrics" | awk '$1 ~ /^create_service_request_handler_counter_total\{/ && $1 !~ /2xx/ {s += $2} END {printf "%d\n", s}'
}
steps_now() { metric "$port" clamp_steps_executed_total; }
# diagnose DB LABEL: what an unfinished or failed run left, into the record folder (the
# server still up): its log's warnings, rows by kind and status, joins not done, and the
# answers of GET /serviceRequest/{id} for some unfinished (else failed) parents and children.
short_status='import json, sys
j = json.load(sys.stdin)
j["steps"] = " ".join(s["name"] + ":" + s["status"] for s in j.get("steps", []))
print(json.dumps(j))'
diagnose() {
  local db=$1 f="$out/$tag-diag-$2.txt" id
  # Best effort: a query that fails here must not end the script before its report.
  (
    set +e
    echo "## rows by kind and status"
    dbsql "$db" "SELECT CASE WHEN parent_id IS NULL THEN 'parent' ELSE 'child' END, workflow_name, status, count(*)
                 FROM service_requests GROUP BY 1, 2, 3 ORDER BY 1 DESC, 2, 3"
    echo "## fan_joins not done (parent_id step_id total finished failed tolerated)"
    dbsql "$db" "SELECT parent_id, step_id, total, finished, failed, tolerated FROM fan_joins WHERE NOT done LIMIT 10"
    echo "## children finished but not told to their parent"
    dbsql "$db" "SELECT count(*) FROM service_requests WHERE parent_id IS NOT NULL AND NOT parent_told
                 AND status IN ('COMPLETED', 'FAILED', 'CANCELLED')"
    for kind in 'parent_id IS NULL' 'parent_id IS NOT NULL'; do
      for id in $(dbsql "$db" "SELECT id FROM service_requests WHERE $kind
                   ORDER BY (status IN ('COMPLETED')), (status IN ('FAILED', 'CANCELLED')) DESC, id LIMIT 3"); do
        echo "## GET /serviceRequest/$id (steps shortened to name:status)"
        curl -s "http://127.0.0.1:$port/serviceRequest/$id" | python3 -c "$short_status"
      done
    done
    echo "## server log: WARN and ERROR lines (first 40)"
    grep -E 'WARN|ERROR' "$tmp/server.log" | head -40
  ) > "$f" 2>&1
  cp "$tmp/server.log" "$out/$tag-server-$2.log"
  # The server log's warnings and errors by message (ids and counts taken out), for the record.
  grep -E ' (WARN|ERROR) ' "$tmp/server.log" | sed -E 's/^[^ ]+ +//; s/ (service_request_id|step_id|n|rows)=[^ ]+//g' \
    | sort | uniq -c | sort -rn > "$tmp/warn-$2.txt" || true
  echo "bench-fanout: $2 left diagnostics in $f" >&2
}

: > "$tmp/rows"
for round in $(seq 1 "$ROUNDS"); do
  for k in $(rotation "$round" ${#workflows[@]}); do
    wf=${workflows[$k]}
    parents=$(( (CALLS + calls[$wf] - 1) / calls[$wf] ))
    db=clamp_fanout_${round}_$wf
    sql "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
    start_server "$db" "$tmp/server.log"
    put_workflow "$wf"
    sleep 1
    lsn0=$(sql "SELECT pg_current_wal_lsn()")
    [ "$pgss" = 0 ] || sql "SELECT pg_stat_statements_reset()" >/dev/null
    steps0=$(steps_now)
    read -r c0 f0 x0 created0 < <(counts)
    refused0=$(refused_now)
    q0=$(nginx_requests)
    s0=$(proc_ticks "$server_pid"); p0=$(tree_ticks "$postmaster"); n0=$(tree_ticks "$nginx_pid")
    t0=$(now)
    give_up=$((SECONDS + DEADLINE))
    rm -f "$tmp/answered"
    wrk -t1 -c"$CONNS" -d600s -s "$tmp/create-n.lua" "http://127.0.0.1:$port" -- "$wf" "$parents" "$tmp/answered" > "$tmp/wrk-$round-$wf.txt" 2>&1 &
    wrk_pid=$!
    while [ ! -e "$tmp/answered" ] && [ "$SECONDS" -lt "$give_up" ] && kill -0 "$wrk_pid" 2>/dev/null; do sleep 0.02; done
    t_created=$(now)
    kill -INT "$wrk_pid" 2>/dev/null || true
    wait "$wrk_pid" || true
    wrk_pid=
    timed_out=0 stub_reads=0
    # Children per request: a PARALLEL's branches are lanes of their request unless this
    # binary made children (one look, once the creates are answered).
    kids=${children[$wf]}
    if [ "$wf" = parallel ] && [ "$(dbsql "$db" "SELECT EXISTS (SELECT 1 FROM service_requests WHERE parent_id IS NOT NULL)")" = f ]; then
      kids=0
    fi
    while :; do
      read -r c f x n_ < <(counts)
      created=$((n_ - created0))
      if [ $((c + f + x - c0 - f0 - x0)) -ge $((created * (1 + kids))) ] || [ "$SECONDS" -ge "$give_up" ]; then
        # The readings at this moment, kept unless a create counted late shows up within
        # 0.3 s; then the wait goes on.
        t1=$(now)
        s1=$(proc_ticks "$server_pid"); p1=$(tree_ticks "$postmaster"); n1=$(tree_ticks "$nginx_pid")
        q1=$(nginx_requests); stub_reads=$((stub_reads + 1))
        lsn1=$(sql "SELECT pg_current_wal_lsn()")
        steps=$(( $(steps_now) - steps0 ))
        stmts_at_end
        if [ "$SECONDS" -ge "$give_up" ]; then timed_out=1; break; fi
        sleep 0.3
        [ "$(created_now)" -gt "$n_" ] || break
      fi
      sleep 0.05
    done
    wal=$(sql "SELECT pg_wal_lsn_diff('$lsn1', '$lsn0')::bigint")
    read -r cc ff xx _ < <(counts)
    read -r parents_open parents_bad children_open children_bad < <(dbsql "$db" "SELECT
      count(*) FILTER (WHERE parent_id IS NULL AND status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')),
      count(*) FILTER (WHERE parent_id IS NULL AND status IN ('FAILED', 'CANCELLED')),
      count(*) FILTER (WHERE parent_id IS NOT NULL AND status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')),
      count(*) FILTER (WHERE parent_id IS NOT NULL AND status IN ('FAILED', 'CANCELLED')) FROM service_requests")
    # The requests created (the server's counter can lag a create answered on a connection wrk left).
    created=$(dbsql "$db" "SELECT count(*) FROM service_requests WHERE parent_id IS NULL")
    refused=$(( $(refused_now) - refused0 ))
    if [ "$timed_out" = 1 ] || [ $((parents_bad + children_bad + parents_open + children_open + refused)) -gt 0 ]; then
      diagnose "$db" "$round-$wf"
    fi
    stop "$server_pid"; server_pid=
    sql "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
    # nginx's count, less its status reads after the one at the start.
    nginx_calls=$((q1 - q0 - stub_reads))
    echo "$round $wf $parents $created $kids $nginx_calls $steps $((cc - c0)) $((ff - f0)) $((xx - x0)) $parents_open $parents_bad $children_open $children_bad $timed_out $t0 $t_created $t1 $((s1 - s0)) $((p1 - p0)) $((n1 - n0)) $wal $tmp/wrk-$round-$wf.txt $stmts $refused" >> "$tmp/rows"
    echo "$round $nginx_calls" > "$tmp/stmts-$wf.round"
    read -r -a r < <(tail -1 "$tmp/rows")
    echo "round $round $wf: $created requests ($refused creates refused), $nginx_calls step calls in $(bm elapsed "$t0" "$t1" --fmt .2f) s" \
      "= $(bm rate 0 "$nginx_calls" "$t0" "$t1" --fmt ,.0f)/s; per step call: server $(bm cpu-per "${r[18]}" "$nginx_calls" --fmt .1f) µs," \
      "Postgres $(bm cpu-per "${r[19]}" "$nginx_calls" --fmt .1f) µs, WAL $(bm ratio "$wal" "$nginx_calls" --fmt ,.0f) B"
  done
done

# One MAP of BIG_ITEMS items: time to COMPLETED, the server's peak resident memory.
: > "$tmp/big"
if [ "$BIG" != 0 ]; then
  db=clamp_fanout_big
  sql "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
  start_server "$db" "$tmp/server.log"
  put_workflow big
  sleep 1
  hwm0=$(awk '/^VmHWM:/ {print $2}' "/proc/$server_pid/status")
  rss0=$(awk '/^VmRSS:/ {print $2}' "/proc/$server_pid/status")
  lsn0=$(sql "SELECT pg_current_wal_lsn()")
  q0=$(nginx_requests)
  s0=$(proc_ticks "$server_pid"); p0=$(tree_ticks "$postmaster")
  t0=$(now)
  give_up=$((SECONDS + BIG_DEADLINE))
  id=$(curl -s -X POST -H 'Content-Type: application/json' -d '{"batch":1}' "http://127.0.0.1:$port/serviceRequest/big" \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["serviceRequestId"])')
  status=NEW timed_out=1
  while [ "$SECONDS" -lt "$give_up" ]; do
    status=$(curl -s "http://127.0.0.1:$port/serviceRequest/$id" | grep -o '"status":"[A-Z_]*"' | head -1 | cut -d'"' -f4)
    case "$status" in COMPLETED | FAILED | CANCELLED) timed_out=0; break ;; esac
    sleep 0.2
  done
  t1=$(now)
  s1=$(proc_ticks "$server_pid"); p1=$(tree_ticks "$postmaster")
  q1=$(nginx_requests)
  wal=$(sql "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '$lsn0')::bigint")
  hwm1=$(awk '/^VmHWM:/ {print $2}' "/proc/$server_pid/status")
  rss1=$(awk '/^VmRSS:/ {print $2}' "/proc/$server_pid/status")
  read -r ch_done ch_bad ch_open < <(dbsql "$db" "SELECT count(*) FILTER (WHERE status = 'COMPLETED'),
    count(*) FILTER (WHERE status IN ('FAILED', 'CANCELLED')),
    count(*) FILTER (WHERE status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')) FROM service_requests WHERE parent_id IS NOT NULL")
  resp_len=$(curl -s "http://127.0.0.1:$port/serviceRequest/$id" | wc -c)
  if [ "$timed_out" = 1 ] || [ "$status" != COMPLETED ] || [ "$ch_bad" -gt 0 ]; then diagnose "$db" big; fi
  stop "$server_pid"; server_pid=
  sql "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
  echo "$BIG_ITEMS $id $status $timed_out $t0 $t1 $hwm0 $hwm1 $rss0 $rss1 $((q1 - q0 - 1)) $((s1 - s0)) $((p1 - p0)) $wal $ch_done $ch_bad $ch_open $resp_len" > "$tmp/big"
  echo "MAP of $BIG_ITEMS items: $status in $(bm elapsed "$t0" "$t1" --fmt .1f) s; VmHWM $hwm0 kB before, $hwm1 kB after"
fi

git_head="$(git rev-parse --short HEAD 2>/dev/null || echo none)"
[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || git_head="$git_head (working tree with uncommitted changes)"
server_cmd="$BIN --port $port --bind 127.0.0.1 --database-url $base/<fresh db per run>${SERVER_FLAGS:+ $SERVER_FLAGS}"
pg_cmd="PG_EXTRA_CONF=\"$pg_extra\" scripts/dev-postgres.sh start <tmpdir> <port>"
[ -n "$pg_extra" ] || pg_cmd="scripts/dev-postgres.sh start <tmpdir> <port>"
export FO_PGCMD="$pg_cmd" FO_PGSS=$pgss FO_TMP=$tmp FO_BIN=$BIN FO_GIT=$git_head FO_PG="$pg_set" FO_SERVER="$server_cmd" FO_NGINX="$nginx_server" \
  FO_ROUNDS=$ROUNDS FO_CALLS=$CALLS FO_CONNS=$CONNS FO_DEADLINE=$DEADLINE FO_BIG=$BIG FO_BIG_ITEMS=$BIG_ITEMS \
  FO_BIG_DEADLINE=$BIG_DEADLINE FO_CMD="${FO_CMD:-BIN=$BIN ROUNDS=$ROUNDS CALLS=$CALLS scripts/bench-fanout.sh}" \
  FO_DEF_LINEAR="${def[linear]}" FO_DEF_PARALLEL="${def[parallel]}" FO_DEF_MAP="${def[map]}" FO_DEF_BIG="${def[big]}" \
  FO_WRK="wrk -t1 -c$CONNS -d600s -s <perf/wrk/create.lua for N requests, then GET /health> http://127.0.0.1:$port -- <workflow> <N>"
python3 - "$out/$tag.md" <<'PY'
import datetime, hashlib, os, socket, sys
sys.path.insert(0, 'scripts')
from benchmath import cpu_per, median, ratio
E = os.environ
tmp, path = E['FO_TMP'], sys.argv[1]

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

def fmt(x, spec):
    return 'n/a' if x is None or x != x else format(x, spec)

per_req = {'linear': 2, 'parallel': 8, 'map': 101}
names = {'linear': 'linear (2 HTTP steps)', 'parallel': 'PARALLEL of 8', 'map': 'MAP of 100 (after /list)'}
runs = []
for line in open(f'{tmp}/rows'):
    r = line.split()
    (parents, created, kids, calls, steps, comp, failed, canc, p_open, p_bad, c_open, c_bad,
     timed_out) = map(int, r[2:15])
    t0, t_created, t1 = map(float, r[15:18])
    s, p, n, wal = map(int, r[18:22])
    non2xx = int(r[24])
    stmts = None if r[23] == 'n/a' else ratio(int(r[23]), calls)
    runs.append(dict(round=int(r[0]), wf=r[1], per_req=per_req[r[1]], parents=parents, created=created, kids=kids, calls=calls, steps=steps,
                     comp=comp, failed=failed, canc=canc, p_open=p_open, p_bad=p_bad, c_open=c_open, c_bad=c_bad,
                     timed_out=timed_out, non2xx=non2xx, create_s=t_created - t0, secs=t1 - t0,
                     rate=ratio(calls, t1 - t0), server=cpu_per(s, calls), pg=cpu_per(p, calls),
                     both=cpu_per(s + p, calls), nginx=cpu_per(n, calls), wal=ratio(wal, calls), stmts=stmts))
wfs = [w for w in ('linear', 'parallel', 'map') if any(x['wf'] == w for x in runs)]
med = {w: {k: median([x[k] for x in runs if x['wf'] == w]) for k in ('rate', 'server', 'pg', 'both', 'nginx', 'wal', 'stmts', 'secs')
           if all(x[k] is not None for x in runs if x['wf'] == w)}
       for w in wfs}
rel = {w: ratio(med[w]['rate'], med['linear']['rate']) for w in wfs if 'linear' in med}
# Per round: each fan-out's rate ÷ the linear workflow's of the same round.
per_round = {w: [ratio(x['rate'], l['rate']) for x in runs if x['wf'] == w
                 for l in runs if l['wf'] == 'linear' and l['round'] == x['round']] for w in wfs}

o = []
w = o.append
w('# Fan-out: step calls per second and per-call cost, linear against PARALLEL and MAP\n')
w(f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%SZ}, host {socket.gethostname()}, "
  f"nproc {os.cpu_count()}, {cpu_model()}")
w(f"- git HEAD of the tree the script ran in: {E['FO_GIT']}")
w(f"- command: `{E['FO_CMD']}`")
w(f"- server: `{E['FO_SERVER']}` (binary sha256 {sha(E['FO_BIN'])}), a fresh server and database per run")
w(f"- Postgres: throwaway cluster, `{E['FO_PGCMD']}` (the settings of docs/configuration.md): {E['FO_PG']}"
  + ("; pg_stat_statements loaded (its cost is in Postgres CPU, alike for all)" if E['FO_PGSS'] == '1' else '; no pg_stat_statements'))
w(f"- downstream: nginx 127.0.0.1, `worker_processes 1; access_log off;` and `{' '.join(E['FO_NGINX'].split())}`")
w(f"- workflows: linear `{E['FO_DEF_LINEAR']}`; parallel `{E['FO_DEF_PARALLEL']}`; map `{E['FO_DEF_MAP']}`")
w(f"- load per run: about {int(E['FO_CALLS']):,} step calls: CALLS ÷ the workflow's calls per request (2, 8, 101) requests, "
  f"created by `{E['FO_WRK']}` (its thread stopped once the N creates are answered, a refused create not sent again, then wrk interrupted; "
  "creates refused: the server's `create_service_request_handler_counter_total` other than 2xx; requests: the "
  "parent rows in the database at the end; step calls due: requests × 2, 8 or 101), then a wait "
  f"(up to {E['FO_DEADLINE']} s from the first create) until the server's "
  "`completed_…` + `failed_…` + `cancelled_service_request_handler_counter_total` reach the requests created "
  "(`create_service_request_handler_counter_total{status=\"2xx\"}`) plus their children (100 each for the MAP; 8 each for the PARALLEL when the binary made children, none when its branches ran as lanes)")
w(f"- rounds: {E['FO_ROUNDS']}, the three workflows in rotating order; server, Postgres, nginx and wrk share the machine")
w('- step calls: the requests nginx read in the run (stub_status, its own reads left out): every HTTP step call, '
  'the MAP\'s `list` step included; per step call, from wrk\'s start to the moment the last request finished: '
  'server CPU (`/proc/<pid>/stat`), Postgres CPU (the postmaster with its children, live and reaped: this cluster '
  'only), nginx CPU likewise, WAL (`pg_wal_lsn_diff`), statements (`pg_stat_statements` calls of the database, '
  'reset at the run\'s start and read at its end, utility statements such as BEGIN and COMMIT counted too); '
  'step calls/s = step calls ÷ that time\n')
w('| round | workflow | creates asked | creates refused | requests | children | step calls due | step calls (nginx) | '
  'steps executed (server) | create phase s | elapsed s | step calls/s | server µs | Postgres µs | server + Postgres µs | nginx µs | WAL bytes | statements | '
  'finished (completed / failed / cancelled) | unfinished |')
w('|' + '---|' * 20)
for x in runs:
    w(f"| {x['round']} | {x['wf']} | {x['parents']:,} | {x['non2xx']:,} | {x['created']:,} | {x['created'] * x['kids']:,} | "
      f"{x['created'] * x['per_req']:,} | {x['calls']:,} | {x['steps']:,} | "
      f"{x['create_s']:.2f} | {x['secs']:.2f} | {x['rate']:,.0f} | {fmt(x['server'], '.1f')} | {fmt(x['pg'], '.1f')} | "
      f"{fmt(x['both'], '.1f')} | {fmt(x['nginx'], '.1f')} | {fmt(x['wal'], ',.0f')} | {fmt(x['stmts'], '.2f')} | "
      f"{x['comp']:,} / {x['failed']:,} / {x['canc']:,} | {x['p_open'] + x['c_open']:,} |")
problems = [x for x in runs if x['timed_out'] or x['p_open'] or x['c_open'] or x['p_bad'] or x['c_bad'] or x['non2xx']]
stem = os.path.basename(path)[:-3]
for x in problems:
    w(f"\n**Warning**: round {x['round']} {x['wf']}: parents unfinished {x['p_open']}, FAILED/CANCELLED {x['p_bad']}; "
      f"children unfinished {x['c_open']}, FAILED/CANCELLED {x['c_bad']}; creates refused (not 2xx) {x['non2xx']}; "
      f"deadline passed: {bool(x['timed_out'])} (see {stem}-diag-{x['round']}-{x['wf']}.txt and "
      f"{stem}-server-{x['round']}-{x['wf']}.log). The server log's warnings and errors, by message:\n")
    f = f"{tmp}/warn-{x['round']}-{x['wf']}.txt"
    lines = [l.strip().split(None, 1) for l in open(f) if l.strip()] if os.path.exists(f) else []
    for n_, msg in lines or [('0', '(none)')]:
        w(f"    {int(n_):>5} × {msg}")
w('\nMedians per workflow (per step call) and step calls/s ÷ the linear workflow\'s:\n')
w('| workflow | step calls/s | ÷ linear (of the medians) | ÷ linear, per round | server µs | Postgres µs | '
  'server + Postgres µs | nginx µs | WAL bytes | statements |')
w('|' + '---|' * 10)
for wf in wfs:
    m = med[wf]
    w(f"| {names[wf]} | {m['rate']:,.0f} | {fmt(rel.get(wf), '.3f')} | {', '.join(f'{v:.3f}' for v in per_round[wf])} | "
      f"{fmt(m['server'], '.1f')} | {fmt(m['pg'], '.1f')} | {fmt(m['both'], '.1f')} | {fmt(m['nginx'], '.1f')} | {fmt(m['wal'], ',.0f')} | {fmt(m.get('stmts'), '.2f')} |")

for wf in wfs:
    f = f'{tmp}/stmts-{wf}.txt'
    if E['FO_PGSS'] != '1' or not os.path.exists(f):
        continue
    rnd, calls = open(f'{tmp}/stmts-{wf}.round').read().split()
    calls = int(calls)
    w(f'\nStatements of {wf} (round {rnd}, {calls:,} step calls), the ten first by execution time:\n')
    w('| calls per step call | rows per call | execution µs (elapsed) per step call | µs per call | statement |')
    w('|---|---|---|---|---|')
    for line in open(f):
        n_, rows, ms, q = line.rstrip('\n').split('\x1f', 3)
        n_, rows, ms = int(n_), int(rows), float(ms)
        q = q.strip()
        q = (q[:100] + '…') if len(q) > 100 else q
        q = q.replace('|', '\\|').replace('`', "'")
        w(f"| {n_ / calls:.3f} | {rows / n_ if n_ else 0:.1f} | {ms * 1e3 / calls:.2f} | {ms * 1e3 / n_ if n_ else 0:.1f} | `{q}` |")

verdict = []
fanouts = [wf for wf in ('parallel', 'map') if wf in rel]
if fanouts:
    met = all(rel[wf] >= 0.9 for wf in fanouts) and not problems
    verdict.append('step calls/s ÷ linear of the medians: ' + ', '.join(f"{names[wf]} {rel[wf]:.3f}" for wf in fanouts)
                   + f" (asked ≥ 0.9: {'met' if met else 'NOT met'})")
late = [x for x in runs if x['timed_out'] or x['p_open'] or x['c_open']]
bad = [x for x in runs if x['p_bad'] or x['c_bad']]
refused = [x for x in runs if x['non2xx']]
if late:
    verdict.append(f"{len(late)} run(s) unfinished at the deadline")
if bad:
    verdict.append(f"{len(bad)} run(s) with FAILED or CANCELLED requests")
if refused:
    verdict.append(f"creates refused in {len(refused)} of {len(runs)} runs "
                   f"({', '.join(sorted(set(x['wf'] for x in refused)))}; "
                   f"{sum(x['non2xx'] for x in refused):,} in all)")
if not late and not bad:
    verdict.append('every request created completed')

big = open(f'{tmp}/big').read().split()
if big:
    items, bid, status, timed_out = int(big[0]), big[1], big[2], int(big[3])
    t0, t1 = float(big[4]), float(big[5])
    hwm0, hwm1, rss0, rss1, calls, s, p, wal, ch_done, ch_bad, ch_open, resp = map(int, big[6:18])
    w(f"\n## One MAP of {items:,} items (maxConcurrency 16)\n")
    w(f"- workflow: `{E['FO_DEF_BIG']}`; one request created with curl on a fresh server and database, then its "
      f"`GET /serviceRequest/{{id}}` read every 0.2 s until final (up to {E['FO_BIG_DEADLINE']} s); "
      "VmHWM and VmRSS from `/proc/<pid>/status` of the server before the create (after start and `POST /workflow`) and after\n")
    w('| status | time to final s | step calls (nginx) | step calls/s | children completed / failed or cancelled / unfinished | '
      'server µs per call | Postgres µs per call | WAL bytes per call | VmHWM before MB | VmHWM after MB | VmRSS before MB | VmRSS after MB | GET answer bytes |')
    w('|' + '---|' * 13)
    w(f"| {status}{' (deadline passed)' if timed_out else ''} | {t1 - t0:.1f} | {calls:,} | {ratio(calls, t1 - t0):,.0f} | "
      f"{ch_done:,} / {ch_bad:,} / {ch_open:,} | {cpu_per(s, calls):.1f} | {cpu_per(p, calls):.1f} | {ratio(wal, calls):,.0f} | "
      f"{hwm0 / 1024:.1f} | {hwm1 / 1024:.1f} | {rss0 / 1024:.1f} | {rss1 / 1024:.1f} | {resp:,} |")
    verdict.append(f"MAP of {items:,}: {status} in {t1 - t0:.1f} s, server VmHWM {hwm0 / 1024:.1f} → {hwm1 / 1024:.1f} MB")

w('\n**Verdict: ' + '; '.join(verdict) + '.**')
open(path, 'w').write('\n'.join(o) + '\n')
PY
cat "$out/$tag.md"
