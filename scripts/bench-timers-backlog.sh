#!/usr/bin/env bash
# Timers behind a backlog, two server binaries side by side (alternating per round), on a
# throwaway Postgres with the settings of docs/configuration.md: one instance of one
# runtime (`--threads 1`) with `--max-running SLOTS` (4: slots are per runtime), a one-step workflow calling `clamp-bench mock` with a DELAY
# (20ms) service time, its creates offered open-loop at RATE/s (300: about 1.5 times what
# four slots finish) for DURATION s (60) by `clamp-bench create`, and meanwhile a probe
# request of [WAIT PT1S, HTTP] created every 0.5 s. A probe's lateness is when its WAIT
# step completed (its COMPLETED record's finished_at) minus when it was due (its first
# record's started_at + 1 s): p50, p99 and max per binary and round, with a histogram.
# Beside each probe, a retry probe: [WAIT PT1S, an HTTP step to a port nobody listens on
# with {maxAttempts 2, initialIntervalMs 1000, maxIntervalMs 1000}]: its first attempt
# runs as its WAIT ends and fails at once, its back-off is 0.5-1 s (the jitter), and its
# lateness is its second attempt's start (the step's record) minus the WAIT's end + 1 s:
# at most 0 when the back-off ended within its jitter. Those requests end FAILED.
# Writes perf/runs/<date>-<host>/<commit>-<tag>/<tag>.md.
#
#   A=/tmp/bins/clamp-old B=target/release/clamp scripts/bench-timers-backlog.sh
#
# Settings: A, B (server binaries; B alone measures one), ROUNDS (1 per binary), RATE,
# DURATION, SLOTS, DELAY, DEADLINE (600: seconds to wait for the backlog to drain), TAG
# (timers-backlog), BENCH_BIN (target/release/clamp-bench).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
A=${A:-}
B=${B:-target/release/clamp}
ROUNDS=${ROUNDS:-1}
RATE=${RATE:-300}
DURATION=${DURATION:-60}
SLOTS=${SLOTS:-4}
DELAY=${DELAY:-20ms}
DEADLINE=${DEADLINE:-600}
BENCH_BIN=${BENCH_BIN:-target/release/clamp-bench}
tag=${TAG:-timers-backlog}
for b in $A $B "$BENCH_BIN"; do
  [ -x "$b" ] || { echo "bench-timers-backlog: $b is not an executable" >&2; exit 1; }
done
need psql postgresql-client

out=$(bench_out "$tag")
tmp=$(mktemp -d /tmp/bench-timers.XXXXXX)
pg_dir=$(mktemp -d /tmp/bench-timers-pg.XXXXXX)
server_pid='' mock_pid='' load_pid=''
cleanup() {
  stop "$load_pid" "$server_pid" "$mock_pid"
  scripts/dev-postgres.sh stop "$pg_dir" >/dev/null 2>&1 || true
  rm -rf "$tmp" "$pg_dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

pg_port=$(free_port)
base=$(scripts/dev-postgres.sh start "$pg_dir" "$pg_port"); base=${base%/clamp}
dbsql() { PGOPTIONS='-c client_min_messages=warning' psql "$base/$1" -qAtX -F ' ' -v ON_ERROR_STOP=1 -c "$2"; }

mock_port=$(free_port)
"$BENCH_BIN" mock --port "$mock_port" --threads 1 --delay "$DELAY" > "$tmp/mock.log" 2>&1 &
mock_pid=$!
wait_up "$mock_port"
mock="http://127.0.0.1:$mock_port"
# A port nobody listens on: the retry probe's calls are refused.
refused=$(free_port)

port=$(free_port)
post() {
  local code
  code=$(curl -s -o "$tmp/answer.json" -w '%{http_code}' -H 'Content-Type: application/json' -d "$2" "http://127.0.0.1:$port$1")
  case "$code" in 2??) ;; *) echo "bench-timers-backlog: POST $1 answered $code: $(cat "$tmp/answer.json")" >&2; exit 1 ;; esac
}

# run SIDE BIN DB: one measured run; appends "SIDE p50 p99 max n" to $tmp/results and the
# probes' latenesses (ms) to $tmp/late-SIDE.
run() {
  local side=$1 bin=$2 db=$3
  fresh_db "$base" "$db"
  serve "$port" "$tmp/server-$side.log" "$bin" --port "$port" --bind 127.0.0.1 \
    --database-url "$base/$db" --threads 1 --max-running "$SLOTS"
  post /workflow "{\"name\":\"work\",\"steps\":[{\"name\":\"call\",\"mode\":\"HTTP\",\"val\":{\"method\":\"GET\",\"url\":\"$mock/api/step1\"}}]}"
  post /workflow "{\"name\":\"retry-probe\",\"steps\":[{\"name\":\"nap\",\"mode\":\"WAIT\",\"val\":{\"duration\":\"PT1S\"}},{\"name\":\"call\",\"mode\":\"HTTP\",\"val\":{\"method\":\"GET\",\"url\":\"http://127.0.0.1:$refused/down\"},\"retry\":{\"maxAttempts\":2,\"initialIntervalMs\":1000,\"maxIntervalMs\":1000}}]}"
  post /workflow "{\"name\":\"probe\",\"steps\":[{\"name\":\"nap\",\"mode\":\"WAIT\",\"val\":{\"duration\":\"PT1S\"}},{\"name\":\"call\",\"mode\":\"HTTP\",\"val\":{\"method\":\"GET\",\"url\":\"$mock/api/step1\"}}]}"
  "$BENCH_BIN" create --url "http://127.0.0.1:$port" --workflow work --rate "$RATE" \
    --duration "${DURATION}s" --warmup 0s --connections 64 > "$tmp/load-$side.txt" 2>&1 &
  load_pid=$!
  local until=$((SECONDS + DURATION)) probes=0
  while [ "$SECONDS" -lt "$until" ]; do
    post /serviceRequest/probe '{}'
    post /serviceRequest/retry-probe '{}'
    probes=$((probes + 1))
    sleep 0.5
  done
  wait "$load_pid" || true
  load_pid=''
  local load_end=$SECONDS drained=$((SECONDS + DEADLINE)) left
  while :; do
    left=$(dbsql "$db" "SELECT count(*) FROM service_requests WHERE status NOT IN ('COMPLETED','FAILED','CANCELLED')")
    [ "$left" -eq 0 ] && break
    [ "$SECONDS" -ge "$drained" ] && { echo "bench-timers-backlog: $left requests unfinished after ${DEADLINE}s" >&2; break; }
    sleep 1
  done
  dbsql "$db" "
    SELECT round(extract(epoch FROM (max(st.finished_at) FILTER (WHERE st.status = 'COMPLETED'))
                 - (min(st.started_at) + interval '1 second')) * 1000)::int
    FROM service_requests r JOIN steps_status st ON st.service_request_id = r.id AND st.step_name = 'nap'
    WHERE r.workflow_name = 'probe' GROUP BY r.id" > "$tmp/late-$side-now"
  cat "$tmp/late-$side-now" >> "$tmp/late-$side"
  dbsql "$db" "
    SELECT round(extract(epoch FROM h.started_at - (w.finished_at + interval '1 second')) * 1000)::int
    FROM service_requests r
    JOIN steps_status w ON w.service_request_id = r.id AND w.step_name = 'nap' AND w.status = 'COMPLETED'
    JOIN steps_status h ON h.service_request_id = r.id AND h.step_name = 'call' AND h.attempts = 2
    WHERE r.workflow_name = 'retry-probe'" > "$tmp/retry-$side-now"
  cat "$tmp/retry-$side-now" >> "$tmp/retry-$side"
  local drain=$((SECONDS - load_end)) created
  created=$(dbsql "$db" "SELECT count(*) FROM service_requests WHERE workflow_name = 'work'")
  local failed
  failed=$(dbsql "$db" "SELECT count(*) FROM service_requests
    WHERE status <> CASE WHEN workflow_name = 'retry-probe' THEN 'FAILED' ELSE 'COMPLETED' END")
  [ "$failed" -eq 0 ] || { echo "bench-timers-backlog: $failed requests did not complete (side $side)" >&2; exit 1; }
  local quantiles='
import sys
v = [int(x) for x in sys.stdin.read().split()]
q = lambda p: v[min(len(v) - 1, int(p * len(v)))] if v else -1
print(q(0.5), q(0.99), v[-1] if v else -1, len(v))'
  echo "$side $(sort -n "$tmp/late-$side-now" | python3 -c "$quantiles") $probes $created $drain \
$(sort -n "$tmp/retry-$side-now" | python3 -c "$quantiles")" >> "$tmp/results"
  stop "$server_pid"
  server_pid=''
}

sides="B"
[ -n "$A" ] && sides="A B"
for r in $(seq 1 "$ROUNDS"); do
  order=$sides
  [ -n "$A" ] && order=$(ab_order "$r")
  for side in $order; do
    bin=$B
    [ "$side" = A ] && bin=$A
    run "$side" "$bin" "timers_${side}_$r"
  done
done

hist() {
  sort -n "$1" | python3 -c '
import sys
v = [int(x) for x in sys.stdin.read().split()]
bounds = [0, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000]
lo = None
for b in bounds + [None]:
    n = sum(1 for x in v if (lo is None or x > lo) and (b is None or x <= b))
    label = f"<= {b} ms" if b is not None else f"> {lo} ms"
    print(f"| {label} | {n} |")
    lo = b'
}
{
  echo "# Timers behind a backlog ($tag)"
  echo
  machine_line
  echo
  echo "Command: \`A=${A:-} B=$B ROUNDS=$ROUNDS RATE=$RATE DURATION=$DURATION SLOTS=$SLOTS DELAY=$DELAY scripts/bench-timers-backlog.sh\`"
  echo "(README's Postgres: scripts/dev-postgres.sh; one instance, --threads 1 --max-running $SLOTS; creates of a"
  echo "one-step workflow calling clamp-bench mock ($DELAY) offered at $RATE/s for ${DURATION}s; a probe"
  echo "[WAIT PT1S, HTTP] created every 0.5 s; lateness = WAIT completed - (its start + 1 s); beside each, a"
  echo "retry probe [WAIT PT1S, HTTP to a refused port, 2 attempts, back-off 1 s with its jitter])."
  echo
  echo "| side | p50 ms | p99 ms | max ms | probes measured | probes created | creates stored | s to drain after the load | retry p50 ms | retry p99 ms | retry max ms | retries measured |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  while read -r side p50 p99 max n probes created drain r50 r99 rmax rn; do
    echo "| $side | $p50 | $p99 | $max | $n | $probes | $created | $drain | $r50 | $r99 | $rmax | $rn |"
  done < "$tmp/results"
  echo
  echo "A retry's lateness: its second attempt's start minus (its first attempt's start + 1 s);"
  echo "its back-off is drawn between 0.5 and 1 s, so at most 0 is within the jitter."
  for side in $sides; do
    echo
    echo "Lateness of side $side's probes (all rounds):"
    echo
    echo "| lateness | probes |"
    echo "|---|---|"
    hist "$tmp/late-$side"
    echo
    echo "Lateness of side $side's retries past the longest back-off (all rounds; at most 0 is within the jitter):"
    echo
    echo "| lateness | retries |"
    echo "|---|---|"
    hist "$tmp/retry-$side"
  done
} > "$out/$tag.md"
cat "$out/$tag.md"
