#!/usr/bin/env bash
# Draws docs/observability.md's picture of one request's trace from spans clamp really exported: a
# server on a fresh database with tracing on, exporting to the OTLP receiver stand-in
# (tests/otlp/receiver.py); a downstream that fails a step's first call (503) and then
# answers, with a traceparent of its own; a three-step workflow (HTTP, retried; an ASYNC
# AMQP publish to RabbitMQ, answered over POST /stepResponse; HTTP), one create carrying a caller's traceparent, then
# scripts/trace-svg.py over the spans.
#
#   scripts/trace-picture.sh [OUT.svg]   # default docs/traces/request-trace.svg
#
# Needs target/debug/clamp (or BIN=…), the Python test tools (scripts/services.sh
# py-tools), Postgres on 127.0.0.1:5432 and RabbitMQ on 127.0.0.1:5672.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/traces/request-trace.svg}
bin=${BIN:-target/debug/clamp}
py=target/py-tools/bin/python
tmp=$(mktemp -d)
db="clamp_trace_picture_$$"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true;
      psql -q -h 127.0.0.1 -U postgres -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

"$py" tests/otlp/receiver.py --port 0 --port-file "$tmp/otlp-port" --out "$tmp/spans.jsonl" 2>/dev/null &
pids+=($!)
# The downstream: the first call of each Idempotency-Key to /reserve answers 503.
down=$(free_port)
cat > "$tmp/down.py" <<'PY'
import http.server, json, sys
seen = set()
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        key = (self.path, self.headers.get("idempotency-key"))
        first = key not in seen
        seen.add(key)
        code = 503 if self.path == "/reserve" and first else 200
        body = json.dumps({"ok": code == 200}).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        if self.path == "/confirm":
            self.send_header("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
python3 "$tmp/down.py" "$down" &
pids+=($!)
# The AMQP step's queue (an AMQP step publishes to a queue that exists).
rabbitmqctl -q eval 'rabbit_amqqueue:declare(rabbit_misc:r(<<"/">>, queue, <<"clamp_trace_picture">>), true, false, [], none, <<"trace-picture">>).' >/dev/null
for _ in $(seq 1 100); do [ -s "$tmp/otlp-port" ] && break; sleep 0.1; done
port=$(free_port)
OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$(cat "$tmp/otlp-port")" OTEL_BSP_SCHEDULE_DELAY=100 \
  OTEL_SERVICE_NAME=clamp LOG_LEVEL=warn \
  "$bin" --port "$port" --bind 127.0.0.1 --threads 1 \
  --database-url "postgres://postgres@127.0.0.1:5432/$db" > "$tmp/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do curl -sf -o /dev/null "http://127.0.0.1:$port/health" && break; sleep 0.1; done
curl -sf -o /dev/null -X POST "http://127.0.0.1:$port/workflow" -H 'content-type: application/json' -d @- <<JSON
{"name": "order", "steps": [
  {"name": "reserve", "mode": "HTTP", "val": {"method": "POST", "url": "http://127.0.0.1:$down/reserve"},
   "retry": {"maxAttempts": 3, "initialIntervalMs": 50}},
  {"name": "notify", "mode": "AMQP", "val": {"connection_url": "amqp://guest:guest@127.0.0.1:5672/%2f", "queue_name": "clamp_trace_picture"}},
  {"name": "confirm", "mode": "HTTP", "val": {"method": "POST", "url": "http://127.0.0.1:$down/confirm"}}]}
JSON
id=$(curl -sf -X POST "http://127.0.0.1:$port/serviceRequest/order" -H 'content-type: application/json' \
  -H 'traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' -d '{"order": 42}' \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["serviceRequestId"])')
wait_for() {  # wait_for STATUS
  for _ in $(seq 1 100); do
    curl -s "http://127.0.0.1:$port/serviceRequest/$id" | grep -q "\"status\":\"$1\"" && return 0
    sleep 0.1
  done
  echo "trace-picture: $id did not become $1" >&2
  exit 1
}
# The AMQP step is ASYNC: the request pauses until the service answers; here it answers
# over the API (POST /stepResponse).
wait_for PAUSED
sleep 0.2
curl -sf -o /dev/null -X POST "http://127.0.0.1:$port/stepResponse" -H 'content-type: application/json' \
  -d "{\"serviceRequestId\": \"$id\", \"stepId\": 2, \"response\": {\"notified\": true}}"
wait_for COMPLETED
for _ in $(seq 1 50); do grep -q '"service request order"' "$tmp/spans.jsonl" 2>/dev/null && break; sleep 0.1; done
sleep 0.5
mkdir -p "$(dirname "$out")"
scripts/trace-svg.py "$tmp/spans.jsonl" --trace 4bf92f3577b34da6a3ce929d0e0e4736 --out "$out" \
  --title "One service request's trace (exported by clamp over OTLP)"
cp "$tmp/spans.jsonl" "${out%.svg}.jsonl"
rabbitmqctl -q purge_queue clamp_trace_picture >/dev/null || true
echo "$out"
