#!/usr/bin/env bash
# create ÷ health, the repository's headline ratio (scripts/bench-ratio.sh until it became
# the one script for it), measured as pairs: for each round, GET /health then
# POST /serviceRequest against the same API-only server (--max-running 0), closed loop,
# back to back, with the CPU each process used (server, all Postgres processes, the load
# generator) and how busy the machine was. On a shared machine one pair can be off by
# ±20%; the median of several pairs is the figure to quote. Writes
# perf/runs/<date>-<host>/<commit>-<tag>/<tag>.md and <tag>-server.log.
#
#   scripts/bench.sh                                   # ack=commit, 128 connections, 5 rounds of 8 s
#   ACK=accept CONNS=512 ROUNDS=3 DURATION=10 scripts/bench.sh
#   SERVER_FLAGS="--flush-concurrency 1" TAG=fc1 scripts/bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
ACK=${ACK:-commit}
CONNS=${CONNS:-128}
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-5}
bin=${BIN:-target/release}
[ -n "${BIN:-}" ] || { scripts/services.sh postgres >/dev/null; cargo build --release --workspace --bins -q; }
tag=${TAG:-ratio-$ACK-c$CONNS}
out=$(bench_out "$tag")
base=postgres://postgres@127.0.0.1:5432
db=clamp_bench_ratio
port=18300
mock_port=18301
server_cmd="$bin/clamp --port $port --bind 127.0.0.1 --database-url $base/$db --ack $ACK --max-running 0 ${SERVER_FLAGS:-}"
fresh_db "$base" "$db"
server_pid='' mock_pid=''
trap 'stop "$server_pid" "$mock_pid"' EXIT
"$bin/clamp-bench" mock --port $mock_port --threads 1 >/dev/null 2>&1 &
mock_pid=$!
# shellcheck disable=SC2086  # the command and SERVER_FLAGS are split into words on purpose
serve "$port" "$out/$tag-server.log" $server_cmd

# Cumulative CPU ticks: server, Postgres (every process), generator, machine busy, machine total.
ticks() {
  local u n s i w irq sirq st
  read -r _ u n s i w irq sirq st _ < /proc/stat
  echo "$(proc_ticks "$server_pid") $(sum_ticks postgres) $(sum_ticks clamp-bench) $((u + n + s + irq + sirq + st)) $((u + n + s + i + w + irq + sirq + st))"
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
    rate=$(bm json "/tmp/$tag-$what.json" achieved_rate --fmt .0f)
    line="$line $rate $a $b"
  done
  rows+=("$line")
done

python3 - "$out/$tag.md" "$server_cmd" "$ACK" "$CONNS" "$DURATION" "$ROUNDS" "${rows[@]}" <<'PY'
import subprocess, sys, datetime, socket, os
sys.path.insert(0, "scripts")
from benchmath import median, ratio as div
path, server_cmd, ack, conns, duration, rounds, *rows = sys.argv[1:]
def cpu(a, b):
    d = [y - x for x, y in zip(a, b)]
    per_cpu = d[4] / os.cpu_count()
    return [div(x, per_cpu) * 100 for x in d[:4]]  # % of one core; busy as % of one core summed
lines, ratios = [], []
for r in rows:
    f = r.split()
    rnd, hrate, ha, hb, crate, ca, cb = f[0], int(f[1]), f[2:7], f[7:12], int(f[12]), f[13:18], f[18:23]
    hc = cpu(list(map(int, ha)), list(map(int, hb)))
    cc = cpu(list(map(int, ca)), list(map(int, cb)))
    ratio = div(crate, hrate)
    ratios.append(ratio)
    # machine CPU (µs) per request = busy cores / rate
    hus = div(hc[3] / 100, hrate) * 1e6
    cus = div(cc[3] / 100, crate) * 1e6
    lines.append(f"| {rnd} | {hrate:,} | {crate:,} | {ratio:.2f} | "
                 f"{hc[0]:.0f} / {hc[2]:.0f} / {hc[3]:.0f} | {cc[0]:.0f} / {cc[1]:.0f} / {cc[2]:.0f} / {cc[3]:.0f} | "
                 f"{hus:.1f} | {cus:.1f} | {div(cc[1] / 100, crate) * 1e6:.1f} |")
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
    o.write(f"**median ratio {median(ratios):.2f}** (min {min(ratios):.2f}, max {max(ratios):.2f})\n")
print(open(path).read())
PY
