#!/usr/bin/env bash
# Two server binaries compared on the end-to-end workload (open-loop creates of the
# two-step HTTP workflow against the built-in mock, executed by the same server), in
# alternating rounds so that the machine's drift hits both alike. Per round: the server's
# CPU per completed request (ticks and completions read inside the window) and the
# creates' latency. Writes perf/runs/<date>-<host>/<tag>.md.
#
#   A=/tmp/old/clamp B=target/release/clamp scripts/bench-e2e-ab.sh
#   RATE=6000 ROUNDS=5 DURATION=20 WINDOW=8 TAG=engine-doc A=… B=… scripts/bench-e2e-ab.sh
set -euo pipefail
cd "$(dirname "$0")/.."
: "${A:?A=path of the first server binary}" "${B:?B=path of the second server binary}"
RATE=${RATE:-6000}
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-20}
WINDOW=${WINDOW:-8}
CONNS=${CONNS:-256}
bin=target/release
[ -x "$bin/clamp-bench" ] || cargo build --release -p clamp-bench
out=perf/runs/$(date -u +%Y-%m-%d)-$(hostname)
mkdir -p "$out"
tag=${TAG:-e2e-ab}
base=postgres://postgres@127.0.0.1:5432
db=clamp_bench_ab
port=18600
mock_port=18601
"$bin/clamp-bench" mock --port $mock_port --threads 1 >/dev/null 2>&1 &
mock_pid=$!
server_pid=
trap 'kill $mock_pid ${server_pid:-} 2>/dev/null || true' EXIT
completed() { curl -s "localhost:$port/metrics" | awk '/^completed_service_request_handler_counter_total/ {print $2}'; }

rows=()
for round in $(seq 1 "$ROUNDS"); do
  for which in A B; do
    server=${!which}
    psql "$base/postgres" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
    "$server" --port $port --bind 127.0.0.1 --database-url "$base/$db" ${SERVER_FLAGS:-} >/dev/null 2>&1 &
    server_pid=$!
    for _ in $(seq 1 100); do curl -sf "localhost:$port/health" >/dev/null && break; sleep 0.1; done
    "$bin/clamp-bench" create --url "http://127.0.0.1:$port" -c "$CONNS" -r "$RATE" -d "${DURATION}s" --warmup 2s -q \
      --downstream "http://127.0.0.1:$mock_port" --json "/tmp/$tag-$round-$which.json" >/dev/null &
    gen_pid=$!
    sleep 5
    t1=$(awk '{print $14+$15}' /proc/$server_pid/stat); c1=$(completed)
    sleep "$WINDOW"
    t2=$(awk '{print $14+$15}' /proc/$server_pid/stat); c2=$(completed)
    wait $gen_pid
    kill $server_pid; wait $server_pid 2>/dev/null || true
    rows+=("$round $which $((t2 - t1)) $(python3 -c "print(int(float('$c2') - float('$c1')))") /tmp/$tag-$round-$which.json")
  done
done

python3 - "$out/$tag.md" "$A" "$B" "$RATE" "$CONNS" "$DURATION" "$WINDOW" "${SERVER_FLAGS:-}" "${rows[@]}" <<'PY'
import json, statistics, subprocess, sys, datetime, socket, os
path, a, b, rate, conns, duration, window, flags, *rows = sys.argv[1:]
per = {"A": [], "B": []}
lines = []
for r in rows:
    rnd, which, ticks, done, js = r.split()
    d = json.load(open(js))
    lat = d["latency_us"]
    us = int(ticks) * 10000 / int(done) if int(done) else float("nan")
    per[which].append((us, lat["p50"] / 1000, lat["p99"] / 1000))
    lines.append(f"| {rnd} | {which} | {int(done) / float(window):,.0f} | {us:.1f} | {lat['p50'] / 1000:.1f} | {lat['p99'] / 1000:.1f} | {d['achieved_rate']:,.0f} |")
git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
with open(path, "w") as o:
    o.write(f"# End to end A/B at {rate}/s offered, {conns} connections\n\n")
    o.write(f"- date: {datetime.datetime.utcnow():%Y-%m-%dT%H:%M:%SZ}, host {socket.gethostname()}, nproc {os.cpu_count()}, git {git}\n")
    o.write(f"- A: `{a}`; B: `{b}`; server flags: `{flags or 'none'}`\n")
    o.write(f"- per round and binary: fresh database, `clamp-bench create -c {conns} -r {rate} -d {duration}s --warmup 2s` against `clamp-bench mock`; "
            f"server CPU and completions read over {window} s starting 5 s in\n")
    o.write("- server, Postgres, mock and generator share the machine\n\n")
    o.write("| round | binary | completed/s in window | server CPU µs per completed | create p50 ms | create p99 ms | creates/s achieved |\n|---|---|---|---|---|---|---|\n")
    o.write("\n".join(lines) + "\n\n")
    for w in ("A", "B"):
        v = per[w]
        o.write(f"- **{w}**: median server CPU {statistics.median(x[0] for x in v):.1f} µs per completed request; "
                f"create p99 {min(x[2] for x in v):.1f}–{max(x[2] for x in v):.1f} ms\n")
print(open(path).read())
PY
