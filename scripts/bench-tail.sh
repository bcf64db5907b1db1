#!/usr/bin/env bash
# The tail of durable creates at a fixed rate: open loop, API-only server
# (--max-running 0), on a throwaway Postgres with the settings of docs/configuration.md (or PG=machine:
# the machine's cluster with its defaults). Each run: RATE/s for WARMUP s unmeasured, then
# CHECKPOINT (so full-page writes are in the window, as in production), then RATE/s for
# DURATION s measured. With MID_CHECKPOINT=1 a CHECKPOINT is also forced halfway through
# the measured window. Writes perf/runs/<date>-<host>/<commit>-<tag>/<tag>.md.
#
#   scripts/bench-tail.sh                                   # 16,000/s, 3 runs of 20 s
#   PG=machine RATE=8000 DURATION=60 RUNS=1 MID_CHECKPOINT=1 scripts/bench-tail.sh
#   FIND_MAX=1 scripts/bench-tail.sh      # instead: the highest rate with p99 <= SLO (10ms), and its plot
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
RATE=${RATE:-16000}
CONNS=${CONNS:-256}
WARMUP=${WARMUP:-20}
DURATION=${DURATION:-20}
RUNS=${RUNS:-3}
bin=${BIN:-target/release}
[ -n "${BIN:-}" ] || cargo build --release --workspace --bins -q
tag=${TAG:-tail-$RATE-${PG:-dev}-pg}
[ "${FIND_MAX:-0}" != 1 ] || tag=${TAG:-find-max-${SLO:-10ms}-${PG:-dev}-pg}
out=$(bench_out "$tag")
if [ "${PG:-dev}" = machine ]; then
  scripts/services.sh postgres >/dev/null
  base=postgres://postgres@127.0.0.1:5432
  pg_desc="the machine's cluster"
else
  pg_dir=/tmp/clamp-bench-tail-pg
  base=$(scripts/dev-postgres.sh start $pg_dir 55499); base=${base%/clamp}
  pg_desc="throwaway cluster from \`scripts/dev-postgres.sh\` (the settings of docs/configuration.md)"
fi
db=clamp_bench_tail
port=18530
fresh_db "$base" "$db"
server_cmd="$bin/clamp --port $port --bind 127.0.0.1 --database-url $base/$db --max-running 0 ${SERVER_FLAGS:-}"
server_pid=''
trap 'stop "$server_pid"; [ -z "${pg_dir:-}" ] || scripts/dev-postgres.sh stop $pg_dir >/dev/null' EXIT
# shellcheck disable=SC2086  # the command and SERVER_FLAGS are split into words on purpose
serve "$port" "$out/$tag-server.log" $server_cmd
pg_settings=$(pg_settings "$base")
gen="$bin/clamp-bench create --url http://127.0.0.1:$port -c $CONNS -t 1 -r $RATE -q --downstream http://127.0.0.1:9"
if [ "${FIND_MAX:-0}" = 1 ]; then
  fm="$gen --find-max --slo-p99 ${SLO:-10ms} -d ${DURATION}s --warmup 5s --start-rate ${START_RATE:-4000}"
  fm=${fm/ -r $RATE/}
  $fm --plot "$out/$tag.svg" --json "$out/$tag.json" > "$out/$tag.txt" 2>&1
  {
    echo "# Highest create rate with p99 <= ${SLO:-10ms}, open loop, API-only"
    echo
    echo "- date: $(date -u +%FT%TZ), host $(hostname), nproc $(nproc), git $(git_rev)"
    echo "- server: \`$server_cmd\`"
    echo "- search: \`$fm\`; plot: [$tag.svg]($tag.svg), raw: [$tag.json]($tag.json)"
    echo "- Postgres: $pg_desc: $pg_settings"
    echo
    echo '```'
    cat "$out/$tag.txt"
    echo '```'
  } > "$out/$tag.md"
  cat "$out/$tag.md"
  exit 0
fi
rows=()
for run in $(seq 1 "$RUNS"); do
  $gen -d "${WARMUP}s" --warmup 0s > /dev/null
  psql "$base/$db" -qAtc "CHECKPOINT"
  mid=
  if [ "${MID_CHECKPOINT:-0}" = 1 ]; then
    ( sleep $((DURATION / 2)); psql "$base/$db" -qAtc "CHECKPOINT" ) &
    mid=$!
  fi
  $gen -d "${DURATION}s" --warmup 0s --json "/tmp/$tag-$run.json" > /dev/null
  [ -z "$mid" ] || wait "$mid"
  rows+=("$(python3 -c "
import json
j = json.load(open('/tmp/$tag-$run.json')); l = j['latency_us']
print(f\"| $run | {j['offered_rate']:,.0f} | {j['achieved_rate']:,.0f} | {sum(j.get('errors', {}).values())} | {l['p50']/1000:.2f} ms | {l['p99']/1000:.2f} ms | {l['p999']/1000:.2f} ms | {l['max']/1000:.1f} ms |\")")")
  echo "${rows[-1]}"
done
{
  echo "# Durable creates at ${RATE}/s, open loop, API-only"
  echo
  echo "- $(machine_line)"
  echo "- git: $(git_rev)"
  echo "- server: \`$server_cmd\`"
  echo "- each run: \`$gen -d ${WARMUP}s --warmup 0s\` (unmeasured), \`CHECKPOINT\`, then \`$gen -d ${DURATION}s --warmup 0s\`$([ "${MID_CHECKPOINT:-0}" = 1 ] && echo ", with a \`CHECKPOINT\` forced $((DURATION / 2)) s into it")"
  echo "- Postgres: $pg_desc: $pg_settings"
  echo "- everything (server, Postgres, generator) shares the machine"
  echo
  echo "| run | offered/s | achieved/s | errors | p50 | p99 | p99.9 | max |"
  echo "|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$out/$tag.md"
