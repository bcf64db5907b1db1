#!/usr/bin/env bash
# Clients that poll: virtual users each create a two-step request (against the mock
# downstream) and read its status until it completes, every POLL (20 ms), as Clamp's
# clients poll `pollUrl`; then the same with long polls (`?waitMs=`, beyond Clamp). The
# server runs with its defaults on the machine's Postgres (or PG=dev: a throwaway cluster
# with the settings of docs/configuration.md). Alternating rounds; writes perf/runs/<date>-<host>/<commit>-<tag>/<tag>.md.
#
#   scripts/bench-poll.sh                      # 512 users, 20 ms, 2 rounds of 20 s each
#   CONNS=256 ROUNDS=3 scripts/bench-poll.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
CONNS=${CONNS:-512}
POLL=${POLL:-20ms}
LONG=${LONG:-2s}
DURATION=${DURATION:-20}
ROUNDS=${ROUNDS:-2}
bin=${BIN:-target/release}
scripts/services.sh postgres >/dev/null
[ -n "${BIN:-}" ] || cargo build --release --workspace --bins -q
tag=${TAG:-poll-c$CONNS}
out=$(bench_out "$tag")
base=postgres://postgres@127.0.0.1:5432
if [ "${PG:-}" = dev ]; then
  pg_dir=/tmp/clamp-bench-poll-pg
  base=$(scripts/dev-postgres.sh start $pg_dir 55494); base=${base%/clamp}
fi
db=clamp_bench_poll
port=18330
mock_port=18331
fresh_db "$base" "$db"
server_pid=''
mock_cmd="$bin/clamp-bench mock --port $mock_port --threads 1"
$mock_cmd >/dev/null 2>&1 &
mock_pid=$!
trap 'stop "$server_pid" "$mock_pid"; [ -z "${pg_dir:-}" ] || scripts/dev-postgres.sh stop $pg_dir >/dev/null' EXIT
server_cmd="$bin/clamp --port $port --bind 127.0.0.1 --database-url $base/$db ${SERVER_FLAGS:-}"
# shellcheck disable=SC2086  # the command and SERVER_FLAGS are split into words on purpose
serve "$port" "$out/$tag-server.log" $server_cmd
pg_settings=$(pg_settings "$base")
reads() { curl -s "localhost:$port/metrics" | awk -v s="$1" '$1 == "clamp_status_reads_total{source=\"" s "\"}" {print $2}'; }
# Cumulative CPU ticks (1/100 s): server, every Postgres process, the generator and the mock.
ticks() { echo "$(proc_ticks $server_pid) $(sum_ticks postgres) $(sum_ticks clamp-bench)"; }
gen="$bin/clamp-bench e2e --url http://127.0.0.1:$port --downstream http://127.0.0.1:$mock_port -c $CONNS -t 2 -d ${DURATION}s --warmup 2s -q --timeout 10s"
rows=()
for round in $(seq 1 "$ROUNDS"); do
  for mode in poll long; do
    flags=(--poll-interval "$POLL"); [ $mode = long ] && flags=(--long-poll "$LONG")
    m0=$(reads memory); d0=$(reads database); r0=$(reads row)
    t0=$(ticks)
    $gen "${flags[@]}" --json "/tmp/$tag-$mode.json" >/dev/null
    m1=$(reads memory); d1=$(reads database); r1=$(reads row)
    t1=$(ticks)
    line=$(python3 -c "
import json, sys
sys.path.insert(0, 'scripts')
from benchmath import cores
j = json.load(open('/tmp/$tag-$mode.json'))
lat = j['latency_us']
s0, p0, g0 = map(int, '$t0'.split()); s1, p1, g1 = map(int, '$t1'.split())
secs = $DURATION + 2
print($round, '$mode', round(j['achieved_rate']), sum(j.get('errors', {}).values()), round(lat['p50'] / 1000, 1), round(lat['p99'] / 1000, 1), int(float('$m1' or 0) - float('$m0' or 0)), int(float('$r1' or 0) - float('$r0' or 0)), int(float('$d1' or 0) - float('$d0' or 0)), f'{cores(s1 - s0, secs):.2f}', f'{cores(p1 - p0, secs):.2f}', f'{cores(g1 - g0, secs):.2f}')")
    rows+=("$line")
    echo "$line"
  done
done
{
  echo "# Polling clients: $CONNS users, create + read until COMPLETED"
  echo
  echo "- $(machine_line)"
  echo "- git: $(git_rev)"
  echo "- server: \`$server_cmd\`"
  echo "- mock: \`$mock_cmd\`"
  echo "- generator: \`$gen --poll-interval $POLL\` (poll), \`… --long-poll $LONG\` (long poll)"
  echo "- Postgres: $([ "${PG:-}" = dev ] && echo 'throwaway cluster from scripts/dev-postgres.sh' || echo "the machine's"): $pg_settings"
  echo "- everything (server, Postgres, mock, generator) shares the machine"
  echo
  echo "Status reads are counted by where the answer came from: memory (a final answer kept),"
  echo "row (the request row from Postgres, the step rows from the memory of the process running"
  echo "it), database (all from Postgres). CPU in cores, over each run (warm-up included)."
  echo
  echo "| round | mode | completed/s | errors | end-to-end p50 | p99 | reads: memory | row | database | CPU: server | Postgres | generator + mock |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  for r in "${rows[@]}"; do
    set -- $r
    echo "| $1 | $2 | $3 | $4 | $5 ms | $6 ms | $7 | $8 | $9 | ${10} | ${11} | ${12} |"
  done
} | tee "$out/$tag.md"
