#!/usr/bin/env bash
# Benchmark of a workflow with one AMQP step, answered by `clamp-bench amqp-responder`
# (the service behind the step) over the machine's RabbitMQ: create a service request,
# poll it until COMPLETED; completed requests per second. Side by side in the same run:
# the server's GET /health (the ceiling) and the two-HTTP-step e2e workflow.
# Writes perf/runs/<date>-<host>/<commit>-amqp/: amqp-*.json and amqp-summary.md.
#
#   scripts/bench-amqp.sh                 # CONNS=64 DURATION=15s WARMUP=2s THREADS=1
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
CONNS=${CONNS:-64}
DURATION=${DURATION:-15s}
WARMUP=${WARMUP:-2s}
GEN_THREADS=${THREADS:-1}
scripts/services.sh postgres
scripts/services.sh rabbitmq
cargo build --release --workspace --bins
bin=target/release
out=$(bench_out amqp)
base=postgres://postgres@127.0.0.1:5432
db=clamp_bench_amqp
port=18200
mock_port=18201
amqp=amqp://guest:guest@127.0.0.1:5672/%2f
steps_q=clamp_bench_steps
responses_q=clamp_bench_responses
cmds="$out/amqp-commands.txt"
: > "$cmds"
run() { echo "$*" >> "$cmds"; "$@"; }

{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(hostname)"
  echo "nproc: $(nproc)"
  grep -m1 'model name' /proc/cpuinfo || true
  echo "rabbitmq: $(rabbitmqctl version 2>/dev/null || echo unknown)"
  echo "postgres: $(psql "$base/postgres" -Atc 'show server_version')"
  echo "load before run: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "git: $(git_rev)"
  echo "settings: connections=$CONNS duration=$DURATION warmup=$WARMUP generator-threads=$GEN_THREADS poll=20ms"
  echo "note: server, Postgres, RabbitMQ, the responder, the mock and the load generator all share this machine"
} > "$out/amqp-machine.txt"

fresh_db "$base" "$db"
# Queues from an earlier run would hold stale messages.
rabbitmqctl delete_queue "$steps_q" >/dev/null 2>&1 || true
rabbitmqctl delete_queue "$responses_q" >/dev/null 2>&1 || true

"$bin/clamp-bench" mock --port $mock_port --threads 1 >/dev/null 2>&1 &
mock_pid=$!
# Started directly, not through `run` (a backgrounded function is a subshell, and killing
# it would leave the responder running).
echo "$bin/clamp-bench amqp-responder --amqp-url $amqp --queue $steps_q" >> "$cmds"
"$bin/clamp-bench" amqp-responder --amqp-url "$amqp" --queue $steps_q > "$out/amqp-responder.log" 2>&1 &
responder_pid=$!
echo "ENABLE_AMQP_INTEGRATION=true CLAMP_QUEUE_NAME=$responses_q $bin/clamp --port $port --bind 127.0.0.1 --database-url $base/$db" >> "$cmds"
server_pid=''
trap 'stop "$mock_pid" "$responder_pid" "$server_pid"' EXIT
serve "$port" "$out/amqp-server.log" env ENABLE_AMQP_INTEGRATION=true CLAMP_QUEUE_NAME=$responses_q \
  "$bin/clamp" --port $port --bind 127.0.0.1 --database-url "$base/$db"
url=http://127.0.0.1:$port
curl -sf "$url/workflow" -d "{\"name\": \"amqp_bench\", \"steps\": [
  {\"name\": \"approve\", \"mode\": \"AMQP\", \"val\": {\"connection_url\": \"$amqp\", \"queue_name\": \"$steps_q\"}}]}" >/dev/null

gen=(-c "$CONNS" -t "$GEN_THREADS" -d "$DURATION" --warmup "$WARMUP" -q)
run "$bin/clamp-bench" health --url $url "${gen[@]}" --json "$out/amqp-health.json" >/dev/null
run "$bin/clamp-bench" e2e --url $url "${gen[@]}" --workflow amqp_bench --poll-interval 20ms \
  --json "$out/amqp-e2e.json" --plot "$out/amqp-e2e.svg" >/dev/null
run "$bin/clamp-bench" e2e --url $url "${gen[@]}" --downstream http://127.0.0.1:$mock_port --poll-interval 20ms \
  --json "$out/amqp-http-e2e.json" >/dev/null
curl -s "$url/metrics" | grep -E '^clamp_broker_' > "$out/amqp-broker-metrics.txt" || true
stop "$server_pid"; server_pid=''
fresh_db "$base" "$db"

python3 - "$out" <<'PY' | tee "$out/amqp-summary.md"
import json, os, sys
sys.path.insert(0, "scripts")
from benchmath import ratio
out = sys.argv[1]
load = lambda n: json.load(open(os.path.join(out, n)))
h, a, e = load("amqp-health.json"), load("amqp-e2e.json"), load("amqp-http-e2e.json")
print(f"# AMQP step benchmark {os.path.basename(out)}\n")
print(open(os.path.join(out, "amqp-machine.txt")).read())
print("| run | completed/s | ratio to health | p50 | p99 | errors |")
print("|---|---|---|---|---|---|")
print(f"| health | {h['achieved_rate']:,.0f}/s | 1.00 | {h['latency_us']['p50']/1000:.2f} ms | {h['latency_us']['p99']/1000:.2f} ms | {sum(h.get('errors', {}).values())} |")
for label, j in [("one AMQP step (publish, confirm, pause, reply, resume)", a), ("two HTTP steps (for comparison)", e)]:
    r = j["e2e"]["completed_rate"]
    print(f"| {label} | {r:,.0f}/s | {ratio(r, h['achieved_rate']):.3f} | {j['latency_us']['p50']/1000:.2f} ms | {j['latency_us']['p99']/1000:.2f} ms | {sum(j.get('errors', {}).values())} (failed {j['e2e']['failed']}) |")
print("\nbroker counters at the end:\n")
print("```\n" + open(os.path.join(out, "amqp-broker-metrics.txt")).read() + "```")
PY
echo "wrote $out/amqp-summary.md"
