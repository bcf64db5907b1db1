#!/usr/bin/env bash
# Requests started from a Kafka trigger against requests created by wrk, one server binary,
# side by side: per round and mode (the order alternating from round to round), a fresh
# database of one throwaway Postgres with the settings of docs/configuration.md, the
# two-step HTTP workflow against nginx (a fixed 200 on 127.0.0.1).
#   wrk:   `wrk -t1 -c64` creates for DURATION seconds, then a wait until every created
#          request has completed;
#   kafka: COUNT records put on a 4-partition topic of a tansu broker (memory storage)
#          while the trigger is paused, then the trigger resumed and a wait until COUNT
#          requests have completed.
# Per mode: completed/s (completed ÷ the time from the first create or the resume to the
# last completion) and server + Postgres CPU per completed request. Writes
# perf/runs/<date>-<host>/<commit>-<tag>/<tag>.md.
#
#   BIN=target/release/clamp ROUNDS=3 COUNT=150000 scripts/bench-trigger.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
BIN=${BIN:-target/release/clamp}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-15}
COUNT=${COUNT:-150000}
DEADLINE=${DEADLINE:-180}
tag=${TAG:-trigger-kafka}
need wrk wrk
need nginx nginx
command -v tansu >/dev/null || { echo "bench-trigger: tansu is missing (scripts/services.sh kafka)" >&2; exit 1; }
now() { date +%s.%N; }
out=$(bench_out "$tag")
tmp=$(mktemp -d /tmp/bench-trigger.XXXXXX)
chmod 755 "$tmp"
pg_dir=$(mktemp -d /tmp/bench-trigger-pg.XXXXXX)
server_pid='' nginx_pid='' tansu_pid=''
cleanup() {
  stop "$server_pid" "$nginx_pid" "$tansu_pid"
  scripts/dev-postgres.sh stop "$pg_dir" >/dev/null 2>&1 || true
  rm -rf "$tmp" "$pg_dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

pg_port=$(free_port)
base=$(scripts/dev-postgres.sh start "$pg_dir" "$pg_port"); base=${base%/clamp}
postmaster=$(head -1 "$pg_dir/postmaster.pid")
nginx_port=$(free_port)
start_nginx "$tmp/nginx" "server { listen 127.0.0.1:$nginx_port; location / { default_type application/json; return 200 '{\"ok\":true}'; } }"
for _ in $(seq 1 50); do curl -sf -o /dev/null -X POST -d x "http://127.0.0.1:$nginx_port/a" && break; sleep 0.1; done
kafka_port=$(free_port)
kafka="tcp://127.0.0.1:$kafka_port"
tansu --listener-url "$kafka" --advertised-listener-url "$kafka" --storage-engine memory://tansu/ > "$tmp/tansu.log" 2>&1 &
tansu_pid=$!
for _ in $(seq 1 50); do (exec 3<>"/dev/tcp/127.0.0.1/$kafka_port") 2>/dev/null && break; sleep 0.1; done

port=$(free_port)
workflow="{\"name\":\"two\",\"steps\":[{\"name\":\"a\",\"mode\":\"HTTP\",\"val\":{\"method\":\"POST\",\"url\":\"http://127.0.0.1:$nginx_port/a\"}},{\"name\":\"b\",\"mode\":\"HTTP\",\"val\":{\"method\":\"POST\",\"url\":\"http://127.0.0.1:$nginx_port/b\"}}]}"
completed() { metric "$port" completed_service_request_handler_counter_total; }
# wait_completed N: until N requests completed (or DEADLINE); prints the time of the last.
wait_completed() {
  local t_end
  t_end=$(( $(date +%s) + DEADLINE ))
  while [ "$(completed)" -lt "$1" ] && [ "$(date +%s)" -lt "$t_end" ]; do sleep 0.05; done
  now
}
# records FILE N FROM: a JSON array of N records {"n": FROM…} as `tansu cat produce` reads it.
records() { python3 -c "import json,sys; n,f=int(sys.argv[1]),int(sys.argv[2]); json.dump([{'value': {'n': i}} for i in range(f, f + n)], open(sys.argv[3], 'w'))" "$2" "$3" "$1"; }

: > "$tmp/rows"
for round in $(seq 1 "$ROUNDS"); do
  for mode in $(rotation "$round" 2 | sed 's/0/wrk/; s/1/kafka/'); do
    db=clamp_trigger_${round}_$mode
    fresh_db "$base" "$db"
    serve "$port" "$tmp/server-$round-$mode.log" "$BIN" --port "$port" --bind 127.0.0.1 --database-url "$base/$db"
    curl -sf -o /dev/null -H 'Content-Type: application/json' -d "$workflow" "localhost:$port/workflow"
    if [ "$mode" = kafka ]; then
      topic="bench_${round}"
      tansu topic create "$topic" --broker "$kafka" --partitions 4 >/dev/null
      curl -sf -o /dev/null -H 'Content-Type: application/json' -d "{\"name\":\"in\",\"workflow\":\"two\",\"paused\":true,\"source\":{\"kafka\":{\"connection\":\"127.0.0.1:$kafka_port\",\"topic\":\"$topic\"}}}" "localhost:$port/triggers"
      for p in 0 1 2 3; do
        records "$tmp/records.json" $((COUNT / 4)) $((p * COUNT / 4))
        tansu cat produce "$topic" "$tmp/records.json" --broker "$kafka" --partition "$p" >/dev/null
      done
      n=$(( (COUNT / 4) * 4 ))
      sleep 1
      s0=$(proc_ticks "$server_pid"); p0=$(tree_ticks "$postmaster"); t0=$(now)
      curl -sf -o /dev/null -X POST "localhost:$port/triggers/in/resume"
      t1=$(wait_completed "$n")
    else
      sleep 1
      s0=$(proc_ticks "$server_pid"); p0=$(tree_ticks "$postmaster"); t0=$(now)
      wrk -t1 -c64 -d"${DURATION}s" -s perf/wrk/create.lua "http://127.0.0.1:$port" -- two > "$tmp/wrk-$round.txt" 2>&1
      n=$(metric "$port" 'create_service_request_handler_counter_total{status="2xx"}')
      t1=$(wait_completed "$n")
    fi
    done_n=$(completed)
    s1=$(proc_ticks "$server_pid"); p1=$(tree_ticks "$postmaster")
    python3 - "$round" "$mode" "$done_n" "$t0" "$t1" "$((s1 - s0))" "$((p1 - p0))" >> "$tmp/rows" <<'EOF'
import sys
r, mode, n, t0, t1, s, p = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
print(f"{r} {mode} {n} {n / (t1 - t0):.0f} {s * 1e4 / n:.1f} {p * 1e4 / n:.1f}")
EOF
    tail -1 "$tmp/rows" | awk '{printf "round %s %s: %s completed, %s/s, server %s µs, Postgres %s µs per request\n", $1, $2, $3, $4, $5, $6}' >&2
    stop "$server_pid"; server_pid=
  done
done

{
  echo "# Requests started from a Kafka trigger against requests created by wrk"
  echo
  echo "- $(machine_line)"
  echo "- git: $(git_rev); binary: \`$BIN\`"
  echo "- command: \`BIN=$BIN ROUNDS=$ROUNDS DURATION=$DURATION COUNT=$COUNT TAG=$tag scripts/bench-trigger.sh\`"
  echo "- Postgres: throwaway cluster from \`scripts/dev-postgres.sh\`: $(pg_settings "$base"); Kafka: tansu (memory storage) on 127.0.0.1; downstream: nginx, a fixed 200"
  echo "- wrk: \`wrk -t1 -c64 -d${DURATION}s\` creates, completed/s from wrk's start to the last completion; kafka: $COUNT records on 4 partitions put there while the trigger was paused, completed/s from its resume to the last completion"
  echo
  echo "| round | mode | completed | completed/s | server µs / request | Postgres µs / request |"
  echo "|---|---|---|---|---|---|"
  awk '{printf "| %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6}' "$tmp/rows"
  echo
  python3 - "$tmp/rows" <<'EOF'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
def med(mode, i): return statistics.median(float(r[i]) for r in rows if r[1] == mode)
k, w = med("kafka", 3), med("wrk", 3)
kc, wc = med("kafka", 4) + med("kafka", 5), med("wrk", 4) + med("wrk", 5)
print(f"**Medians: kafka ÷ wrk completed/s {k / w:.3f} ({k:.0f} against {w:.0f}); server + Postgres CPU per request {kc:.1f} against {wc:.1f} µs ({kc / wc:.3f}).**")
EOF
} | tee "$out/$tag.md"
