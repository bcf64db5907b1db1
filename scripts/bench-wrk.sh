#!/usr/bin/env bash
# Measures POST /serviceRequest against the same server's GET /health with wrk, side by
# side in one run, for ack=commit and ack=accept, and records everything under
# perf/runs/<date>-<host>/wrk/.
#
#   scripts/bench-wrk.sh [connections=128] [seconds=15] [extra server flags...]
#
# Each mode runs health and create alternately REPS times (default 3, env REPS) against
# one server, and reports every pair's ratio and the median: these machines are shared,
# and only figures measured side by side compare honestly.
#
# The server runs with --max-running 0 (API only: no execution competing for the CPU),
# as Clamp's own creation benchmark ran with its workers switched off.
set -euo pipefail
cd "$(dirname "$0")/.."
conns=${1:-128}
secs=${2:-15}
shift 2 || true
extra=("$@")
command -v wrk >/dev/null || { echo "bench-wrk: wrk is required (apt-get install wrk)" >&2; exit 1; }
scripts/services.sh postgres
cargo build --release --bin clamp >/dev/null 2>&1
out=perf/runs/$(date -u +%Y-%m-%d)-$(hostname)/wrk
mkdir -p "$out"
port=18090
db=clamp_bench_wrk
base=postgres://postgres@127.0.0.1:5432
{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(hostname)"
  echo "nproc: $(nproc)"
  grep -m1 'model name' /proc/cpuinfo || true
  free -g | sed -n 2p
  echo "load before run: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "wrk: $(wrk --version 2>&1 | head -1)"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo none)"
} > "$out/machine.txt"

run_mode() {
  local ack=$1
  psql "$base/postgres" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
  ./target/release/clamp --port $port --bind 127.0.0.1 --database-url "$base/$db" --ack "$ack" \
    --max-running 0 "${extra[@]}" > "$out/server-$ack.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 100); do curl -sf "localhost:$port/health" >/dev/null && break; sleep 0.1; done
  curl -sf "localhost:$port/workflow" -d '{"name":"bench","steps":[{"name":"step1","mode":"HTTP","val":{"method":"POST","url":"http://127.0.0.1:9/none"}}]}' >/dev/null
  local hcmd="wrk -t2 -c$conns -d${secs}s --latency http://127.0.0.1:$port/health"
  local ccmd="wrk -t2 -c$conns -d${secs}s --latency -s perf/wrk/create.lua http://127.0.0.1:$port -- bench"
  echo "$hcmd" > "$out/health-$ack.cmd"
  echo "$ccmd" > "$out/create-$ack.cmd"
  local ratios=()
  for rep in $(seq 1 "${REPS:-3}"); do
    $hcmd > "$out/health-$ack-$rep.txt" 2>&1
    $ccmd > "$out/create-$ack-$rep.txt" 2>&1
    local h c non2xx
    h=$(awk '/Requests\/sec/ {print $2}' "$out/health-$ack-$rep.txt")
    c=$(awk '/Requests\/sec/ {print $2}' "$out/create-$ack-$rep.txt")
    non2xx=$(awk '/Non-2xx/ {print $5}' "$out/create-$ack-$rep.txt"); non2xx=${non2xx:-0}
    local r; r=$(echo "$c / $h" | bc -l)
    ratios+=("$r")
    printf "ack=%-6s rep %d: health %8.0f req/s | create %8.0f req/s | create/health %.2f | create p99 %s | non-2xx %s\n" \
      "$ack" "$rep" "$h" "$c" "$r" "$(awk '/ 99%/ {print $2}' "$out/create-$ack-$rep.txt")" "$non2xx" | tee -a "$out/summary.txt"
  done
  curl -s "localhost:$port/metrics" > "$out/metrics-$ack.txt"
  local rows
  rows=$(psql "$base/$db" -qAtc "select count(*) from service_requests")
  kill -TERM $pid; wait $pid || true
  printf "ack=%-6s median create/health %.2f; rows in the table after the run: %s\n" "$ack" \
    "$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')" "$rows" | tee -a "$out/summary.txt"
}
echo "# scripts/bench-wrk.sh $conns $secs ${extra[*]:-}" >> "$out/summary.txt"
run_mode commit
run_mode accept
psql "$base/postgres" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
