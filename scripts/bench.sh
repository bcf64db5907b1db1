#!/usr/bin/env bash
# The benchmark suite. Builds release binaries, makes sure Postgres runs, and for each
# runtime layout (per-core, multi-thread) starts a fresh database and server and measures,
# at equal settings and side by side:
#   health           GET /health, the ceiling every other figure is divided by
#   create (commit)  POST /serviceRequest, answered after COMMIT (API-only server)
#   create (accept)  POST /serviceRequest, answered on enqueue (API-only server)
#   e2e              a two-step HTTP workflow against the built-in mock: create, then poll
#                    until COMPLETED (the executor on)
# plus a wrk cross-check of health and a --find-max search for create. Everything goes to
# perf/runs/<date>-<host>/: command lines, machine description, raw JSON, plots, summary.
#
#   scripts/bench.sh                     # CONNS=128 DURATION=15s WARMUP=2s THREADS=2 by default
#   DURATION=5s scripts/bench.sh         # a quick run
set -euo pipefail
cd "$(dirname "$0")/.."
CONNS=${CONNS:-128}
DURATION=${DURATION:-15s}
WARMUP=${WARMUP:-2s}
GEN_THREADS=${THREADS:-2}
FINDMAX=${FINDMAX:-1}
scripts/services.sh postgres
cargo build --release --workspace --bins
bin=target/release
out=perf/runs/$(date -u +%Y-%m-%d)-$(hostname)
mkdir -p "$out"
base=postgres://postgres@127.0.0.1:5432
db=clamp_bench_suite
port=18100
mock_port=18101
cmds="$out/commands.txt"
: > "$cmds"

{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(hostname)"
  echo "nproc: $(nproc)"
  grep -m1 'model name' /proc/cpuinfo || true
  grep -m1 'cpu MHz' /proc/cpuinfo || true
  free -g | sed -n 2p
  echo "kernel: $(uname -r)"
  echo "postgres: $(psql "$base/postgres" -Atc 'show server_version')"
  echo "load before run: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo none)"
  echo "settings: connections=$CONNS duration=$DURATION warmup=$WARMUP generator-threads=$GEN_THREADS"
  echo "note: server, Postgres, the mock and the load generator all share this machine"
} > "$out/machine.txt"

run() { echo "$*" >> "$cmds"; "$@"; }

"$bin/clamp-bench" mock --port $mock_port --threads 1 >/dev/null 2>&1 &
mock_pid=$!
server_pid=
cleanup() { kill $mock_pid ${server_pid:-} 2>/dev/null || true; }
trap cleanup EXIT

start_server() { # name, flags...
  local name=$1; shift
  [ -n "$server_pid" ] && { kill -TERM $server_pid; wait $server_pid 2>/dev/null || true; }
  psql "$base/postgres" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
  echo "$bin/clamp --port $port --bind 127.0.0.1 --database-url $base/$db $*" >> "$cmds"
  "$bin/clamp" --port $port --bind 127.0.0.1 --database-url "$base/$db" "$@" > "$out/server-$name.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 100); do curl -sf "localhost:$port/health" >/dev/null && return 0; sleep 0.1; done
  echo "bench: server $name did not start" >&2; exit 1
}

gen=(-c "$CONNS" -t "$GEN_THREADS" -d "$DURATION" --warmup "$WARMUP" -q)
url=http://127.0.0.1:$port
for rt in per-core multi-thread; do
  start_server "$rt-commit" --runtime $rt --ack commit --max-running 0
  run "$bin/clamp-bench" health --url $url "${gen[@]}" --json "$out/$rt-health-commit.json" --plot "$out/$rt-health-commit.svg" >/dev/null
  run "$bin/clamp-bench" create --url $url "${gen[@]}" --downstream http://127.0.0.1:$mock_port --json "$out/$rt-create-commit.json" --plot "$out/$rt-create-commit.svg" >/dev/null
  start_server "$rt-accept" --runtime $rt --ack accept --max-running 0
  run "$bin/clamp-bench" health --url $url "${gen[@]}" --json "$out/$rt-health-accept.json" >/dev/null
  run "$bin/clamp-bench" create --url $url "${gen[@]}" --downstream http://127.0.0.1:$mock_port --json "$out/$rt-create-accept.json" --plot "$out/$rt-create-accept.svg" >/dev/null
  start_server "$rt-e2e" --runtime $rt --ack commit
  run "$bin/clamp-bench" health --url $url "${gen[@]}" --json "$out/$rt-health-e2e.json" >/dev/null
  run "$bin/clamp-bench" e2e --url $url "${gen[@]}" --downstream http://127.0.0.1:$mock_port --poll-interval 20ms --json "$out/$rt-e2e.json" --plot "$out/$rt-e2e.svg" >/dev/null
done

# The same server, health by wrk and by clamp-bench at the same closed-loop settings.
if command -v wrk >/dev/null; then
  start_server wrk-check --ack commit --max-running 0
  secs=${DURATION%s}
  echo "wrk -t$GEN_THREADS -c$CONNS -d${secs}s $url/health" >> "$cmds"
  wrk -t"$GEN_THREADS" -c"$CONNS" -d"${secs}s" "$url/health" > "$out/wrk-health.txt" 2>&1
  run "$bin/clamp-bench" health --url $url "${gen[@]}" --json "$out/wrk-check-clamp-bench-health.json" >/dev/null
fi

if [ "$FINDMAX" = 1 ]; then
  start_server findmax --ack commit --max-running 0
  run "$bin/clamp-bench" create --url $url -c "$CONNS" -t "$GEN_THREADS" -q --find-max --slo-p99 20ms \
    --start-rate 4000 --duration 5s --warmup 1s --downstream http://127.0.0.1:$mock_port \
    --json "$out/create-find-max.json" --plot "$out/create-find-max.svg" >/dev/null || true
fi
kill -TERM $server_pid; wait $server_pid 2>/dev/null || true; server_pid=
psql "$base/postgres" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1

python3 - "$out" <<'PY' | tee "$out/summary.md"
import json, os, re, sys
out = sys.argv[1]
def load(name):
    p = os.path.join(out, name)
    return json.load(open(p)) if os.path.exists(p) else None
def row(label, j, ceiling, rate_key="achieved_rate"):
    if not j:
        return f"| {label} | – | – | – | – | – |"
    rate = j[rate_key] if rate_key in j else j["e2e"][rate_key]
    lat = j["latency_us"]
    errs = sum(j.get("errors", {}).values())
    ratio = f"{rate / ceiling:.2f}" if ceiling else "–"
    return f"| {label} | {rate:,.0f}/s | {ratio} | {lat['p50']/1000:.2f} ms | {lat['p99']/1000:.2f} ms | {errs} |"
print(f"# Benchmark run {os.path.basename(out)}\n")
print(open(os.path.join(out, "machine.txt")).read())
print("Each figure is divided by the same server's GET /health measured just before it (ratio).\n")
print("| run | rate | ratio to health | p50 | p99 | errors |")
print("|---|---|---|---|---|---|")
for rt in ["per-core", "multi-thread"]:
    for mode in ["commit", "accept"]:
        h = load(f"{rt}-health-{mode}.json")
        c = load(f"{rt}-create-{mode}.json")
        print(row(f"{rt}: health (ack={mode} server)", h, h["achieved_rate"] if h else None))
        print(row(f"{rt}: create, ack={mode}", c, h["achieved_rate"] if h else None))
    h = load(f"{rt}-health-e2e.json")
    e = load(f"{rt}-e2e.json")
    print(row(f"{rt}: health (executing server)", h, h["achieved_rate"] if h else None))
    if e:
        print(row(f"{rt}: e2e completed (2 HTTP steps, polling)", e, h["achieved_rate"] if h else None, "completed_rate"))
        ov = e["e2e"]["overhead_ms"]
        print(f"|  …orchestration overhead per request | | | {ov['p50']} ms | {ov['p99']} ms | failed {e['e2e']['failed']} |")
w = os.path.join(out, "wrk-health.txt")
cb = load("wrk-check-clamp-bench-health.json")
if os.path.exists(w) and cb:
    m = re.search(r"Requests/sec:\s+([\d.]+)", open(w).read())
    if m:
        wr = float(m.group(1))
        print(f"\nwrk cross-check (GET /health, same server, same settings): wrk {wr:,.0f}/s, clamp-bench {cb['achieved_rate']:,.0f}/s, difference {100*(cb['achieved_rate']-wr)/wr:+.1f}%")
fm = load("create-find-max.json")
if fm and fm.get("find_max"):
    mr = fm["find_max"]["max_rate"]
    print(f"\ncreate --find-max (ack=commit, p99 ≤ 20 ms, zero errors): {mr:,.0f}/s" if mr else "\ncreate --find-max: no rate met the target")
print("\nper-core vs multi-thread (create, ack=commit): " + ", ".join(
    f"{rt} {load(f'{rt}-create-commit.json')['achieved_rate']:,.0f}/s (ratio {load(f'{rt}-create-commit.json')['achieved_rate']/load(f'{rt}-health-commit.json')['achieved_rate']:.2f})"
    for rt in ["per-core", "multi-thread"] if load(f"{rt}-create-commit.json")))
PY
echo "wrote $out"
