#!/usr/bin/env bash
# The product's durable create against the bare reference server (perf/src/bin/
# clamp-reference.rs, the speed of light for the create path), with `wrk -t1 -c128`, in
# alternating rounds of one run: both servers up at once on one throwaway Postgres with
# the settings of docs/configuration.md (scripts/dev-postgres.sh), each in its own database; every round
# measures each server's GET /health (the ceiling) and its create, the order swapped
# every round. CPU per request (server and Postgres) is sampled inside each create run.
# The figure is the median over the rounds of product ÷ reference. The order of the
# creates comes from ab_order (scripts/bench-lib.sh): the reference is A, the product B.
# Writes perf/runs/<date>-<host>/<commit>-<tag>/<tag>.md with both servers' logs.
#
#   scripts/bench-reference.sh                  # 5 rounds of 10 s
#   ROUNDS=7 SERVER_FLAGS="--flush-concurrency 3" TAG=ref-fc3 scripts/bench-reference.sh
#   REF_CMD="/tmp/old/clamp --max-running 0" TAG=ab scripts/bench-reference.sh
#       # another server in the reference's place (given --port and --database-url here;
#       # it must serve the `bench` workflow the script creates on both)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
CONNS=${CONNS:-128}
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-5}
bin=${BIN:-target/release}
command -v wrk >/dev/null || { echo "bench-reference: wrk is required (apt-get install wrk)" >&2; exit 1; }
[ -n "${BIN:-}" ] || cargo build --release --workspace --bins -q
tag=${TAG:-reference-c$CONNS}
out=$(bench_out "$tag")
pg_dir=/tmp/clamp-bench-ref-pg
base=$(scripts/dev-postgres.sh start $pg_dir 55497); base=${base%/clamp}
port=18510
ref_port=18511
for db in clamp_bench_product clamp_bench_reference; do
  fresh_db "$base" "$db"
done
server_cmd="$bin/clamp --port $port --bind 127.0.0.1 --database-url $base/clamp_bench_product --max-running 0 ${SERVER_FLAGS:-}"
ref_cmd="${REF_CMD:-$bin/clamp-reference} --port $ref_port --database-url $base/clamp_bench_reference ${REF_FLAGS:-}"
$server_cmd > "$out/$tag-server.log" 2>&1 &
server_pid=$!
$ref_cmd > "$out/$tag-reference.log" 2>&1 &
ref_pid=$!
trap 'kill $server_pid $ref_pid 2>/dev/null || true; scripts/dev-postgres.sh stop $pg_dir >/dev/null' EXIT
wait_up $port $ref_port
for p in $port $ref_port; do
  # (the bare reference has no workflows and answers 404 here; it takes any name)
  curl -s "localhost:$p/workflow" -d '{"name":"bench","steps":[{"name":"step1","mode":"HTTP","val":{"method":"POST","url":"http://127.0.0.1:9/none"}}]}' >/dev/null
done
pg_settings=$(pg_settings "$base")

# Cumulative CPU ticks (1/100 s) of a process and of every Postgres process.
ticks() { echo "$(proc_ticks "$1") $(sum_ticks postgres)"; }
# run <pid> <port> <health|create>: one wrk run; prints rate, non-2xx, p99, server and
# Postgres CPU µs per request.
run() {
  local pid=$1 p=$2 what=$3 args=() f a b
  f=$(mktemp)
  if [ "$what" = create ]; then args=(-s perf/wrk/create.lua "http://127.0.0.1:$p" -- bench); else args=("http://127.0.0.1:$p/health"); fi
  wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency "${args[@]}" > "$f" 2>&1 &
  local w=$!
  sleep 1; a=$(ticks "$pid"); sleep $((DURATION - 2)); b=$(ticks "$pid")
  wait $w
  python3 - "$f" "$a" "$b" $((DURATION - 2)) <<'EOF'
import sys
sys.path.insert(0, 'scripts')
from benchmath import cpu_per, wrk
rate, non2xx, p99 = wrk(open(sys.argv[1]).read())
(s0, p0), (s1, p1) = map(int, sys.argv[2].split()), map(int, sys.argv[3].split())
n = int(sys.argv[4]) * rate  # requests in the sampled window
print(round(rate), non2xx, p99, f'{cpu_per(s1 - s0, n):.1f}', f'{cpu_per(p1 - p0, n):.1f}')
EOF
  rm -f "$f"
}
rows=()
for round in $(seq 1 "$ROUNDS"); do
  read -r rh _ _ _ _ < <(run $ref_pid $ref_port health)
  read -r ph _ _ _ _ < <(run $server_pid $port health)
  for side in $(ab_order "$round"); do
    if [ "$side" = A ]; then
      read -r rc re rp rs rq < <(run $ref_pid $ref_port create)
    else
      read -r pc pe pp ps pq < <(run $server_pid $port create)
    fi
  done
  rows+=("$round $rh $ph $rc $pc $re $pe $rp $pp $rs $rq $ps $pq")
  echo "round $round: reference health $rh/s create $rc/s; product health $ph/s create $pc/s"
done
stored=$(psql "$base/clamp_bench_reference" -Atc "select count(*) from reference_requests" 2>/dev/null || psql "$base/clamp_bench_reference" -Atc "select count(*) from service_requests"),$(psql "$base/clamp_bench_product" -Atc "select count(*) from service_requests")
{
  echo "# The product's create against the bare reference, wrk -t1 -c$CONNS"
  echo
  echo "- $(machine_line)"
  echo "- git: $(git_rev)"
  echo "- product: \`$server_cmd\`"
  echo "- reference: \`$ref_cmd\`"
  echo "- load, per round and server: \`wrk -t1 -c$CONNS -d${DURATION}s --latency http://…/health\`, then \`wrk -t1 -c$CONNS -d${DURATION}s --latency -s perf/wrk/create.lua http://… -- bench\` (reference and product in alternating order)"
  echo "- Postgres: throwaway cluster from \`scripts/dev-postgres.sh\` (the settings of docs/configuration.md): $pg_settings"
  echo "- everything (both servers, Postgres, wrk) shares the machine; the idle server waits"
  echo
  echo "| round | reference /health | product /health | reference create | product create | product ÷ reference | non-2xx (ref, product) | create p99 (ref, product) | µs/request reference (server + Postgres) | µs/request product |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}" | python3 -c "
import sys
sys.path.insert(0, 'scripts')
from benchmath import median, ratio
rows = [l.split() for l in sys.stdin if l.strip()]
for r in rows:
    n, rh, ph, rc, pc, re_, pe, rp, pp, rs, rq, ps, pq = r
    print(f'| {n} | {int(rh):,} | {int(ph):,} | {int(rc):,} | {int(pc):,} | {ratio(pc, rc):.2f} | {re_}, {pe} | {rp}, {pp} | {rs} + {rq} | {ps} + {pq} |')
print()
m = lambda f: median(f(r) for r in rows)
print(f'Median product ÷ reference: **{m(lambda r: ratio(r[4], r[3])):.2f}** (reference create ÷ its health {m(lambda r: ratio(r[3], r[1])):.2f}, product create ÷ its health {m(lambda r: ratio(r[4], r[2])):.2f}).')
print(f'Median CPU per create: reference {m(lambda r: float(r[9])):.1f} µs server + {m(lambda r: float(r[10])):.1f} µs Postgres; product {m(lambda r: float(r[11])):.1f} + {m(lambda r: float(r[12])):.1f} µs.')"
  echo
  echo "Rows after the run (reference, product): $stored"
} | tee "$out/$tag.md"
