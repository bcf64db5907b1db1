#!/usr/bin/env bash
# End-to-end throughput without polling: service requests of a two-step HTTP workflow,
# created open-loop at RATE per second for DURATION against the built-in mock downstream,
# executed by the same server; completions are read from the server's own counter
# (completed_service_request_handler_counter_total) every 5 s. Writes
# perf/runs/<date>-<host>/<commit>-<tag>/<tag>.{json,md} and <tag>-server.log (tag e2e-open-<rate>).
#
#   RATE=8000 DURATION=60s scripts/bench-e2e.sh
#   SERVER_FLAGS="--step-write-concurrency 1" TAG=name scripts/bench-e2e.sh   # a variant
#   PG=dev scripts/bench-e2e.sh    # against a throwaway cluster started by scripts/dev-postgres.sh
#                                  # (docs/configuration.md's recommended settings) instead of the machine's
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
RATE=${RATE:-8000}
DURATION=${DURATION:-60s}
CONNS=${CONNS:-256}
scripts/services.sh postgres
cargo build --release --workspace --bins
bin=${BIN:-target/release}
base=postgres://postgres@127.0.0.1:5432
if [ "${PG:-}" = dev ]; then
  pg_dir=/tmp/clamp-bench-pg
  base=$(scripts/dev-postgres.sh start $pg_dir 55499); base=${base%/clamp}
fi
db=clamp_bench_e2e
port=18400
mock_port=18401
tag=${TAG:-e2e-open-$RATE}
out=$(bench_out "$tag")
fresh_db "$base" "$db"
server_pid=''
trap 'stop "$mock_pid" "$server_pid"; [ -z "${pg_dir:-}" ] || scripts/dev-postgres.sh stop $pg_dir >/dev/null' EXIT
"$bin/clamp-bench" mock --port $mock_port --threads 1 >/dev/null 2>&1 &
mock_pid=$!
server_cmd="$bin/clamp --port $port --bind 127.0.0.1 --database-url $base/$db ${SERVER_FLAGS:-}"
# shellcheck disable=SC2086  # the command and SERVER_FLAGS are split into words on purpose
serve "$port" "$out/$tag-server.log" $server_cmd
# CPU ticks (1/100 s) of every Postgres process: backends live as long as the pool does.
pg_ticks() { sum_ticks postgres; }
server_ticks() { proc_ticks "$server_pid"; }
completed() { curl -s "localhost:$port/metrics" | awk '/^completed_service_request_handler_counter_total/ {print $2}'; }
gen_cmd="$bin/clamp-bench create --url http://127.0.0.1:$port -c $CONNS -r $RATE -d $DURATION --warmup 2s -q --downstream http://127.0.0.1:$mock_port --json $out/$tag.json"
$gen_cmd > /dev/null &
gen_pid=$!
# Checkpoints Postgres started (by time or by WAL volume) while the generator ran.
checkpoints() { psql "$base/postgres" -Atc "select checkpoints_timed + checkpoints_req from pg_stat_bgwriter"; }
pg_settings=$(pg_settings "$base" wal_compression)
ckpt0=$(checkpoints)
samples=()
t0=$(date +%s.%N); c0=$(completed); pg0=$(pg_ticks); sv0=$(server_ticks)
while kill -0 $gen_pid 2>/dev/null; do
  sleep 5
  samples+=("$(date +%s.%N) $(completed)")
done
wait $gen_pid || true
t1=$(date +%s.%N); pg1=$(pg_ticks); sv1=$(server_ticks); ckpt1=$(checkpoints)
# Let the executor finish what was created, then count.
for _ in $(seq 1 60); do
  left=$(psql "$base/$db" -Atc "select count(*) from service_requests where status not in ('COMPLETED','FAILED')")
  [ "$left" = 0 ] && break; sleep 1
done
final=$(psql "$base/$db" -Atc "select count(*) filter (where status = 'COMPLETED'), count(*) filter (where status = 'FAILED'), count(*) from service_requests")
scans=$(psql "$base/$db" -Atc "select string_agg(format('%s: %s sequential scans reading %s rows, %s index scans', relname, seq_scan, seq_tup_read, idx_scan), '; ') from pg_stat_user_tables where relname in ('service_requests', 'steps_status')")
{
  echo "# End to end, open loop: $RATE/s offered for $DURATION"
  echo
  echo "- $(machine_line)"
  echo "- git: $(git_rev)"
  echo "- server: \`$server_cmd\`"
  echo "- generator: \`$gen_cmd\`"
  echo "- mock: \`$bin/clamp-bench mock --port $mock_port --threads 1\`"
  echo "- everything (server, Postgres, mock, generator) shares the machine"
  echo "- Postgres: $pg_settings; $((ckpt1 - ckpt0)) checkpoint(s) started during the run"
  echo
  echo "Completed per second, from the server's counter, per 5 s interval (warm-up included):"
  echo
  prev_t=$t0; prev_c=$c0
  for s in "${samples[@]}"; do
    t=${s% *}; c=${s#* }
    echo "- $(bm rate "$prev_c" "$c" "$prev_t" "$t" --fmt ,.0f)/s"
    prev_t=$t; prev_c=$c
  done
  echo
  python3 - "$out/$tag.json" "$final" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
done, failed, total = map(int, sys.argv[2].split("|"))
lat = j["latency_us"]
print(f"Creates: {j['ok']:,} ok of {j['requests']:,} due in the measured window, achieved {j['achieved_rate']:,.0f}/s, "
      f"errors {sum(j.get('errors', {}).values())}; create latency p50 {lat['p50']/1000:.1f} ms, p99 {lat['p99']/1000:.1f} ms, max {lat['max']/1000:.1f} ms.")
print(f"\nAfter the run: {total:,} requests stored, {done:,} COMPLETED, {failed:,} FAILED.")
PY
  echo
  echo "Table scans over the run (pg_stat_user_tables): $scans"
  echo
  secs=$(bm elapsed "$t0" "$t1" --fmt .6f)
  echo "CPU over the generator's run (warm-up included), in cores: server $(bm cores $((sv1 - sv0)) "$secs" --fmt .2f), Postgres $(bm cores $((pg1 - pg0)) "$secs" --fmt .2f)"
} | tee "$out/$tag.md"
