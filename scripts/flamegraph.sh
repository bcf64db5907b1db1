#!/usr/bin/env bash
# Profiles the server under load and renders an SVG flame graph.
#
#   scripts/flamegraph.sh [scenario=create] [seconds=15] [extra server flags...]
#
# scenario: create (POST /serviceRequest), health, or e2e (two HTTP steps per request,
# against the load generator's built-in mock). Builds with debug symbols (the `profiling`
# profile), runs the server under `perf record -g` with the software cpu-clock event
# (hardware counters are not available on many virtual machines), drives the load with
# clamp-bench (or wrk for create/health when clamp-bench is not built), and writes
# perf/flamegraphs/<scenario>-<time>.svg with inferno (installed with cargo if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
scenario=${1:-create}
secs=${2:-15}
shift 2 || true
extra=("$@")
command -v perf >/dev/null || { echo "flamegraph: perf is required (apt-get install linux-perf)" >&2; exit 1; }
if ! command -v inferno-flamegraph >/dev/null || ! command -v inferno-collapse-perf >/dev/null; then
  cargo install inferno >/dev/null
fi
scripts/services.sh postgres
cargo build --profile profiling --bin clamp
cargo build --release -p clamp-bench 2>/dev/null || true
bench=target/release/clamp-bench
port=18095
db=clamp_flamegraph
base=postgres://postgres@127.0.0.1:5432
psql "$base/postgres" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
mock_pid=
if [ "$scenario" = e2e ]; then
  "$bench" mock --port 18096 >/dev/null 2>&1 & mock_pid=$!
fi
running=(--max-running 0)
[ "$scenario" = e2e ] && running=()
./target/profiling/clamp --port $port --bind 127.0.0.1 --database-url "$base/$db" "${running[@]}" "${extra[@]}" >/tmp/clamp-flamegraph.log 2>&1 &
pid=$!
trap 'kill $pid ${mock_pid:-} 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do curl -sf "localhost:$port/health" >/dev/null && break; sleep 0.1; done
out=perf/flamegraphs
mkdir -p "$out"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
perf record -e cpu-clock -F 997 -g -p $pid -o "/tmp/clamp-$stamp.perf" -- sleep "$secs" >/dev/null 2>&1 &
perf_pid=$!
case "$scenario" in
  health)
    if [ -x "$bench" ]; then "$bench" health --url "http://127.0.0.1:$port" --connections 128 --duration "${secs}s"
    else wrk -t2 -c128 -d"${secs}s" "http://127.0.0.1:$port/health"; fi ;;
  create)
    curl -sf "localhost:$port/workflow" -d '{"name":"bench","steps":[{"name":"s","mode":"HTTP","val":{"method":"POST","url":"http://127.0.0.1:9/none"}}]}' >/dev/null
    wrk -t2 -c128 -d"${secs}s" -s perf/wrk/create.lua "http://127.0.0.1:$port" -- bench ;;
  e2e)
    "$bench" e2e --url "http://127.0.0.1:$port" --downstream http://127.0.0.1:18096 --connections 64 --duration "${secs}s" ;;
  *) echo "unknown scenario $scenario" >&2; exit 2 ;;
esac
wait $perf_pid || true
perf script -i "/tmp/clamp-$stamp.perf" 2>/dev/null | inferno-collapse-perf | inferno-flamegraph --title "clamp $scenario" > "$out/$scenario-$stamp.svg"
rm -f "/tmp/clamp-$stamp.perf"
echo "wrote $out/$scenario-$stamp.svg"
