#!/usr/bin/env bash
# create ÷ health, measured as pairs: for each round, GET /health then POST /serviceRequest
# against the same server, closed loop, back to back, with the CPU each process used
# (server, all Postgres processes, the load generator) and how busy the machine was.
# On a shared machine one pair can be off by ±20%; the median of several pairs is the
# figure to quote. Writes perf/runs/<date>-<host>/<tag>.md.
#
#   scripts/bench-ratio.sh                                   # ack=commit, 128 connections, 5 rounds of 8 s
#   ACK=accept CONNS=512 ROUNDS=3 DURATION=10 scripts/bench-ratio.sh
#   SERVER_FLAGS="--flush-concurrency 1" TAG=fc1 scripts/bench-ratio.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ACK=${ACK:-commit}
CONNS=${CONNS:-128}
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-5}
bin=${BIN:-target/release}
[ -n "${BIN:-}" ] || { scripts/services.sh postgres >/dev/null; cargo build --release --workspace --bins -q; }
out=perf/runs/$(date -u +%Y-%m-%d)-$(hostname)
mkdir -p "$out"
tag=${TAG:-ratio-$ACK-c$CONNS}
base=postgres://postgres@127.0.0.1:5432
db=clamp_bench_ratio
port=18300
mock_port=18301
server_cmd="$bin/clamp --port $port --bind 127.0.0.1 --database-url $base/$db --ack $ACK --max-running 0 ${SERVER_FLAGS:-}"
psql "$base/postgres" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
$server_cmd > "$out/$tag-server.log" 2>&1 &
server_pid=$!
"$bin/clamp-bench" mock --port $mock_port --threads 1 >/dev/null 2>&1 &
mock_pid=$!
trap 'kill $server_pid $mock_pid 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do curl -sf "localhost:$port/health" >/dev/null && break; sleep 0.1; done

# Cumulative CPU ticks: server, Postgres (every process), generator, machine busy, machine total.
ticks() {
  local p pg=0 gen=0
  for p in $(pgrep -x postgres); do pg=$((pg + $(awk '{print $14+$15}' /proc/$p/stat 2>/dev/null || echo 0))); done
  for p in $(pgrep -x clamp-bench); do gen=$((gen + $(awk '{print $14+$15}' /proc/$p/stat 2>/dev/null || echo 0))); done
  read -r _ u n s i w irq sirq st _ < /proc/stat
  echo "$(awk '{print $14+$15}' /proc/$server_pid/stat) $pg $gen $((u + n + s + irq + sirq + st)) $((u + n + s + i + w + irq + sirq + st))"
}

rows=()
for round in $(seq 1 "$ROUNDS"); do
  line="$round"
  for what in health create; do
    extra=()
    [ "$what" = create ] && extra=(--downstream "http://127.0.0.1:$mock_port")
    "$bin/clamp-bench" "$what" --url "http://127.0.0.1:$port" -c "$CONNS" -t 2 -d "${DURATION}s" --warmup 1s -q \
      "${extra[@]}" --json "/tmp/$tag-$what.json" >/dev/null &
    gen_pid=$!
    # CPU is sampled inside the measured window (after warm-up, before the end).
    sleep 2; a=$(ticks); sleep $((DURATION - 2)); b=$(ticks)
    wait $gen_pid
    rate=$(python3 -c "import json; print(round(json.load(open('/tmp/$tag-$what.json'))['achieved_rate']))")
    line="$line $rate $a $b"
  done
  rows+=("$line")
done

python3 - "$out/$tag.md" "$server_cmd" "$ACK" "$CONNS" "$DURATION" "$ROUNDS" "${rows[@]}" <<'PY'
import statistics, subprocess, sys, datetime, socket, os
path, server_cmd, ack, conns, duration, rounds, *rows = sys.argv[1:]
def cpu(a, b):
    d = [y - x for x, y in zip(a, b)]
    per_cpu = d[4] / os.cpu_count()
    return [x / per_cpu * 100 for x in d[:4]]  # % of one core; busy as % of one core summed
lines, ratios = [], []
for r in rows:
    f = r.split()
    rnd, hrate, ha, hb, crate, ca, cb = f[0], int(f[1]), f[2:7], f[7:12], int(f[12]), f[13:18], f[18:23]
    hc = cpu(list(map(int, ha)), list(map(int, hb)))
    cc = cpu(list(map(int, ca)), list(map(int, cb)))
    ratio = crate / hrate
    ratios.append(ratio)
    # machine CPU (µs) per request = busy cores / rate
    hus = hc[3] / 100 / hrate * 1e6
    cus = cc[3] / 100 / crate * 1e6
    lines.append(f"| {rnd} | {hrate:,} | {crate:,} | {ratio:.2f} | "
                 f"{hc[0]:.0f} / {hc[2]:.0f} / {hc[3]:.0f} | {cc[0]:.0f} / {cc[1]:.0f} / {cc[2]:.0f} / {cc[3]:.0f} | "
                 f"{hus:.1f} | {cus:.1f} | {cc[1] / 100 / crate * 1e6:.1f} |")
git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
with open(path, "w") as o:
    o.write(f"# create ÷ health, ack={ack}, {conns} connections, {rounds} rounds of {duration} s\n\n")
    o.write(f"- date: {datetime.datetime.utcnow():%Y-%m-%dT%H:%M:%SZ}, host {socket.gethostname()}, nproc {os.cpu_count()}, git {git}\n")
    o.write(f"- server: `{server_cmd}`\n")
    o.write(f"- generator, per round: `clamp-bench health|create --url … -c {conns} -t 2 -d {duration}s --warmup 1s`, health first\n")
    o.write("- server, Postgres and generator share the machine; CPU in % of one core (200 = both cores busy)\n\n")
    o.write("| round | health/s | create/s | ratio | health CPU server / gen / busy | create CPU server / pg / gen / busy | machine µs per health | machine µs per create | Postgres µs per create |\n")
    o.write("|---|---|---|---|---|---|---|---|---|\n")
    o.write("\n".join(lines) + "\n\n")
    o.write(f"**median ratio {statistics.median(ratios):.2f}** (min {min(ratios):.2f}, max {max(ratios):.2f})\n")
print(open(path).read())
PY
