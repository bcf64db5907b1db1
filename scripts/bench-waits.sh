#!/usr/bin/env bash
# Waits, measured on one server binary with a throwaway Postgres (the settings of
# docs/configuration.md) and nginx as the downstream:
#   timers  TIMERS (100,000) requests of a workflow with one WAIT step until a time in its
#           payload, due uniformly over SPREAD s (60) starting LEAD s (20) after the first
#           create (so every one is stored before the first is due); created by
#           `wrk -t1 -c$CONNS`, then waited for. Fire lateness per request: when its WAIT
#           step completed (its record's finished_at) minus its time; p50, p99, max and min
#           (none may be negative: nothing fires early).
#   events  EVENTS (20,000) requests paused at an ASYNC HTTP step and as many at an EVENT
#           step (each its own key); then `POST /stepResponse` for every paused ASYNC step
#           and `POST /events/go` for every key, each by `wrk -t1 -c$CONNS`, the two in
#           rotating order per round (ROUNDS, 3); each rate is requests resumed and completed
#           per second, from wrk's start until the last one completed; events ÷ step
#           responses per round and of the medians.
# Writes perf/runs/<date>-<host>/<commit>-<tag>/<tag>.md.
#
#   BIN=/tmp/head/target/release/clamp scripts/bench-waits.sh
#
# Settings: BIN (target/release/clamp), TIMERS, LEAD, SPREAD, EVENTS, ROUNDS, CONNS (32),
# PARTS ("timers events"), TAG (waits), PGSS (1: load pg_stat_statements and report, for the
# last round's events and step responses each, Postgres's time per resumed request and the
# statements that took most of it; 0: off).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
BIN=${BIN:-target/release/clamp}
TIMERS=${TIMERS:-100000}
LEAD=${LEAD:-20}
SPREAD=${SPREAD:-60}
EVENTS=${EVENTS:-20000}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-32}
PARTS=${PARTS:-timers events}
tag=${TAG:-waits}
[ -x "$BIN" ] || { echo "bench-waits: BIN=$BIN is not an executable" >&2; exit 1; }
need wrk wrk
need nginx nginx
need psql postgresql-client

out=$(bench_out "$tag")
tmp=$(mktemp -d /tmp/bench-waits.XXXXXX)
chmod 755 "$tmp"
pg_dir=$(mktemp -d /tmp/bench-waits-pg.XXXXXX)
server_pid='' nginx_pid=''
cleanup() {
  stop "$server_pid" "$nginx_pid"
  scripts/dev-postgres.sh stop "$pg_dir" >/dev/null 2>&1 || true
  rm -rf "$tmp" "$pg_dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

PGSS=${PGSS:-1}
pg_port=$(free_port)
pg_extra=
[ "$PGSS" = 0 ] || pg_extra="shared_preload_libraries = 'pg_stat_statements'"
base=$(PG_EXTRA_CONF=$pg_extra scripts/dev-postgres.sh start "$pg_dir" "$pg_port"); base=${base%/clamp}
dbsql() { PGOPTIONS='-c client_min_messages=warning' psql "$base/$1" -qAtX -F ' ' -v ON_ERROR_STOP=1 -c "$2"; }
pg_set=$(pg_settings "$base")

nginx_port=$(free_port)
nginx_server="server { listen 127.0.0.1:$nginx_port; location / { default_type application/json; return 200 '{\"accepted\":true}'; } }"
start_nginx "$tmp/nginx" "$nginx_server"
for _ in $(seq 1 50); do curl -sf -o /dev/null -X POST -d x "http://127.0.0.1:$nginx_port/a" && break; sleep 0.1; done

port=$(free_port)
start_server() { fresh_db "$base" "$1"; serve "$port" "$tmp/server.log" "$BIN" --port "$port" --bind 127.0.0.1 --database-url "$base/$1"; }
put_workflow() {
  local code
  code=$(curl -s -o "$tmp/wf.json" -w '%{http_code}' -H 'Content-Type: application/json' -d "$1" "http://127.0.0.1:$port/workflow")
  case "$code" in 2??) ;; *) echo "bench-waits: POST /workflow answered $code: $(cat "$tmp/wf.json")" >&2; exit 1 ;; esac
}
now() { date +%s.%N; }
# wait_count DB SQL N DEADLINE: waits until SQL (a count) reaches N, or DEADLINE s pass.
wait_count() {
  local until=$((SECONDS + $4)) n
  while :; do
    n=$(dbsql "$1" "$2")
    [ "$n" -ge "$3" ] && return 0
    [ "$SECONDS" -lt "$until" ] || { echo "bench-waits: $n of $3 after $4 s ($2)" >&2; return 1; }
    sleep 0.2
  done
}

# wrk scripts: N posts (then GET /health until wrk is stopped by the flag file). The body
# of post i comes from body(i).
cat > "$tmp/posts.lua" <<'EOF'
local limit, flag, sent, answered = 0, nil, 0, 0
local health, probed
function setup_posts(args) end
function init(args)
  limit, flag = tonumber(args[1]) or 0, args[2]
  health = wrk.format("GET", "/health", {}, nil)
  init_body(args)
end
function request()
  if not probed then probed = true; return health end
  sent = sent + 1
  if sent <= limit then return post(sent) end
  return health
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
# run_posts LUA N: runs wrk with LUA (posts.lua plus its body) for N posts; prints its start time.
run_posts() {
  local flag=$tmp/done-$RANDOM t0
  rm -f "$flag"
  t0=$(now)
  wrk -t1 -c"$CONNS" -d600s -s "$1" "http://127.0.0.1:$port" -- "$2" "$flag" "${@:3}" > "$tmp/wrk.txt" 2>&1 &
  local w=$!
  while [ ! -f "$flag" ] && kill -0 "$w" 2>/dev/null; do sleep 0.05; done
  kill -INT "$w" 2>/dev/null || true
  wait "$w" 2>/dev/null || true
  echo "$t0"
}

report=$out/$tag.md
{
  echo "# Waits: timer fire lateness, and events against step responses"
  echo
  echo "- $(machine_line)"
  echo "- git HEAD of the tree the script ran in: $(git_rev)"
  echo "- command: \`BIN=$BIN TIMERS=$TIMERS LEAD=$LEAD SPREAD=$SPREAD EVENTS=$EVENTS ROUNDS=$ROUNDS CONNS=$CONNS PARTS=\"$PARTS\" scripts/bench-waits.sh\`"
  echo "- server: \`$BIN --port <port> --bind 127.0.0.1 --database-url <fresh db>\` (binary sha256 $(sha256sum "$BIN" | cut -c1-12)); Postgres: throwaway cluster from \`scripts/dev-postgres.sh\` ($pg_set); nginx answers every POST with a fixed JSON 200"
  echo
} > "$report"

if [[ " $PARTS " == *" timers "* ]]; then
  db=clamp_waits_timers
  start_server "$db"
  put_workflow '{"name":"nap","description":"bench","steps":[{"name":"nap","mode":"WAIT","val":{"until":"nap.request.at"}}]}'
  first=$(( $(date +%s) + LEAD ))
  cat "$tmp/posts.lua" > "$tmp/timers.lua"
  cat >> "$tmp/timers.lua" <<EOF
local first, spread = $first, $SPREAD
function init_body(args)
  wrk.method = "POST"
  wrk.path = "/serviceRequest/nap"
  wrk.headers["Content-Type"] = "application/json"
  math.randomseed(20261203)
end
function post(i)
  local ms = math.floor(math.random() * spread * 1000)
  local at = first + math.floor(ms / 1000)
  local body = string.format('{"at":"%s.%03dZ"}', os.date("!%Y-%m-%dT%H:%M:%S", at), ms % 1000)
  return wrk.format("POST", "/serviceRequest/nap", {["Content-Type"] = "application/json"}, body)
end
EOF
  t0=$(run_posts "$tmp/timers.lua" "$TIMERS")
  t_created=$(now)
  created=$(dbsql "$db" "SELECT count(*) FROM service_requests")
  wait_count "$db" "SELECT count(*) FROM service_requests WHERE status = 'COMPLETED'" "$created" $((LEAD + SPREAD + 120))
  read -r p50 p99 pmax pmin early < <(dbsql "$db" "
    SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY l)::numeric, 1),
           round(percentile_cont(0.99) WITHIN GROUP (ORDER BY l)::numeric, 1),
           round(max(l)::numeric, 1), round(min(l)::numeric, 1), count(*) FILTER (WHERE l < 0)
    FROM (SELECT extract(epoch FROM st.finished_at - (r.payload::json->>'at')::timestamptz) * 1000 AS l
          FROM steps_status st JOIN service_requests r ON r.id = st.service_request_id
          WHERE st.status = 'COMPLETED') x")
  sleeping_max=$(dbsql "$db" "SELECT count(*) FROM steps_status WHERE status = 'STARTED'")
  stop "$server_pid"; server_pid=
  {
    echo "## Timers: $created requests, each one WAIT step until a time in its payload"
    echo
    echo "- created in $(bm elapsed "$t0" "$t_created" --fmt .1f) s by \`wrk -t1 -c$CONNS\`, due uniformly over $SPREAD s from $LEAD s after the first create"
    echo "- fire lateness (the WAIT step's COMPLETED record minus its time), ms: **p50 $p50, p99 $p99, max $pmax**; min $pmin; fired early: $early"
    echo "- WAIT records STARTED (one per sleep, kept beside the COMPLETED record of its end): $sleeping_max"
    echo
  } >> "$report"
  echo "timers: p50 $p50 ms, p99 $p99 ms, max $pmax ms, min $pmin ms, early $early"
fi

if [[ " $PARTS " == *" events "* ]]; then
  cat "$tmp/posts.lua" > "$tmp/create-ask.lua"
  cat >> "$tmp/create-ask.lua" <<'EOF'
function init_body(args) end
function post(i)
  return wrk.format("POST", "/serviceRequest/ask", {["Content-Type"] = "application/json"}, '{"claim":1}')
end
EOF
  cat "$tmp/posts.lua" > "$tmp/create-ev.lua"
  cat >> "$tmp/create-ev.lua" <<'EOF'
function init_body(args) end
function post(i)
  return wrk.format("POST", "/serviceRequest/ev", {["Content-Type"] = "application/json"}, '{"k":"k' .. i .. '"}')
end
EOF
  cat "$tmp/posts.lua" > "$tmp/answer.lua"
  cat >> "$tmp/answer.lua" <<'EOF'
local ids = {}
function init_body(args)
  for line in io.lines(args[3]) do ids[#ids + 1] = line end
end
function post(i)
  return wrk.format("POST", "/stepResponse", {["Content-Type"] = "application/json"},
    '{"serviceRequestId":"' .. ids[i] .. '","stepId":1,"response":{"approved":true}}')
end
EOF
  cat "$tmp/posts.lua" > "$tmp/deliver.lua"
  cat >> "$tmp/deliver.lua" <<'EOF'
function init_body(args) end
function post(i)
  return wrk.format("POST", "/events/go", {["Content-Type"] = "application/json"},
    '{"key":"k' .. i .. '","payload":{"approved":true}}')
end
EOF
  : > "$tmp/rows"
  for round in $(seq 1 "$ROUNDS"); do
    db=clamp_waits_events
    start_server "$db"
    put_workflow "{\"name\":\"ask\",\"description\":\"bench\",\"steps\":[{\"name\":\"ask\",\"mode\":\"HTTP\",\"type\":\"ASYNC\",\"val\":{\"method\":\"POST\",\"url\":\"http://127.0.0.1:$nginx_port/ask\"}}]}"
    put_workflow '{"name":"ev","description":"bench","steps":[{"name":"ev","mode":"EVENT","val":{"event":"go","key":"ev.request.k"}}]}'
    run_posts "$tmp/create-ask.lua" "$EVENTS" >/dev/null
    run_posts "$tmp/create-ev.lua" "$EVENTS" >/dev/null
    wait_count "$db" "SELECT count(*) FROM service_requests WHERE status = 'PAUSED'" $((2 * EVENTS)) 300
    dbsql "$db" "SELECT id FROM service_requests WHERE workflow_name = 'ask'" > "$tmp/ids"
    [ "$PGSS" = 0 ] || dbsql "$db" "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"
    for side in $(rotation "$round" 2); do
      [ "$PGSS" = 0 ] || dbsql "$db" "SELECT pg_stat_statements_reset()" >/dev/null
      if [ "$side" = 0 ]; then
        t0=$(run_posts "$tmp/answer.lua" "$EVENTS" "$tmp/ids")
        wait_count "$db" "SELECT count(*) FROM service_requests WHERE workflow_name = 'ask' AND status = 'COMPLETED'" "$EVENTS" 300
        t1=$(now); sr=$(bm rate 0 "$EVENTS" "$t0" "$t1" --fmt .0f)
      else
        t0=$(run_posts "$tmp/deliver.lua" "$EVENTS")
        wait_count "$db" "SELECT count(*) FROM service_requests WHERE workflow_name = 'ev' AND status = 'COMPLETED'" "$EVENTS" 300
        t1=$(now); ev=$(bm rate 0 "$EVENTS" "$t0" "$t1" --fmt .0f)
      fi
      # The last round's statements of this side: ms of Postgres time per resumed request
      # in all, then the costliest statements (calls and µs per resumed request).
      if [ "$PGSS" != 0 ] && [ "$round" = "$ROUNDS" ]; then
        dbsql "$db" "SELECT round(sum(total_exec_time)::numeric * 1000 / $EVENTS, 1) FROM pg_stat_statements
          WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())" > "$tmp/pg-total-$side"
        PGOPTIONS='-c client_min_messages=warning' psql "$base/$db" -qAtX -F ' | ' -v ON_ERROR_STOP=1 -c "
          SELECT round(calls::numeric / $EVENTS, 2), round(total_exec_time::numeric * 1000 / $EVENTS, 1),
                 left(translate(regexp_replace(query, '\s+', ' ', 'g'), '|', '¦'), 110)
          FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
          ORDER BY total_exec_time DESC LIMIT 6" | sed 's/^/| /; s/ | \([^|]*\)$/ | `\1…` |/' > "$tmp/pg-top-$side"
      fi
    done
    stop "$server_pid"; server_pid=
    echo "$round $sr $ev $(bm ratio "$ev" "$sr" --fmt .3f)" >> "$tmp/rows"
    echo "round $round: step responses $sr/s, events $ev/s, ratio $(bm ratio "$ev" "$sr" --fmt .3f)"
  done
  sr_med=$(awk '{print $2}' "$tmp/rows" | bm median --fmt .0f)
  ev_med=$(awk '{print $3}' "$tmp/rows" | bm median --fmt .0f)
  {
    echo "## Events against step responses: $EVENTS paused requests each, per round"
    echo
    echo "| round | step responses resumed and completed /s | events delivered, resumed and completed /s | events ÷ step responses |"
    echo "|---|---|---|---|"
    while read -r r a b c; do echo "| $r | $a | $b | $c |"; done < "$tmp/rows"
    echo "| median | $sr_med | $ev_med | $(bm ratio "$ev_med" "$sr_med" --fmt .3f) |"
    echo
    echo "**Events ÷ step responses of the medians: $(bm ratio "$ev_med" "$sr_med" --fmt .3f)** (asked ≥ 0.8)."
    if [ "$PGSS" != 0 ]; then
      for side in 0 1; do
        name=$([ "$side" = 0 ] && echo "Step responses" || echo "Events")
        echo
        echo "### $name, round $ROUNDS: Postgres $(cat "$tmp/pg-total-$side") µs of statement time per resumed request"
        echo
        echo "| calls per request | µs per request | statement |"
        echo "|---|---|---|"
        cat "$tmp/pg-top-$side"
      done
    fi
  } >> "$report"
fi
echo "bench-waits: $report"
