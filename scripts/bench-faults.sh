#!/usr/bin/env bash
# Faults, not speed: REQUESTS service requests of the two-step HTTP workflow, created
# closed-loop over CONNS connections and each retried until acknowledged, while the mock
# downstream answers 503 to the first call of FAIL_PCT% of Idempotency-Keys and (with
# PG_RESTART=1) Postgres is stopped PG_AT s into the run for PG_DOWN s. Every acknowledged
# request is then followed until it is final; `clamp-bench faults --check` fails the run
# unless each one COMPLETED, no step was called more often than its faults required, and
# the mock never had more than LIMIT calls in flight. Always on a throwaway cluster from
# scripts/dev-postgres.sh, so stopping it touches nothing else. Writes
# perf/runs/<date>-<host>/<commit>-<tag>/: <tag>.{json,md}, <tag>-server.log and <tag>-metrics.txt.
#
#   scripts/bench-faults.sh                                # tag faults
#   PG_RESTART=1 scripts/bench-faults.sh                   # tag faults-pg-restart
#   REQUESTS=300 LIMIT= TAG=try scripts/bench-faults.sh    # LIMIT empty: no --downstream-max-in-flight
#   SERVER_FLAGS="--step-timeout-ms 2000" MOCK_FLAGS="--retry-after 1" scripts/bench-faults.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
REQUESTS=${REQUESTS:-4000}
CONNS=${CONNS:-16}
DELAY=${DELAY:-20ms}
FAIL_PCT=${FAIL_PCT:-25}
PG_RESTART=${PG_RESTART:-0}
PG_DOWN=${PG_DOWN:-5}
PG_AT=${PG_AT:-2}
SETTLE=${SETTLE:-180s}
# `-`, not `:-`: LIMIT= (set but empty) means "do not pass the flag" (servers without it).
LIMIT=${LIMIT-64}
if [ "$PG_RESTART" = 1 ]; then tag=${TAG:-faults-pg-restart}; else tag=${TAG:-faults}; fi
cargo build --release --workspace --bins
bin=${BIN:-target/release}
out=$(bench_out "$tag")
pg_port=${PG_PORT:-55497}
port=18700
mock_port=18701
pg_dir=/tmp/clamp-bench-faults-pg-$pg_port
work=$(mktemp -d /tmp/clamp-bench-faults.XXXXXX)
mock_pid= server_pid= gen_pid= restart_pid=
cleanup() {
  stop "$gen_pid" "$restart_pid" "$server_pid" "$mock_pid"
  scripts/dev-postgres.sh stop "$pg_dir" >/dev/null 2>&1 || true
  rm -rf "$pg_dir" "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A cluster left over by an interrupted run would keep the port: start from nothing.
scripts/dev-postgres.sh stop "$pg_dir" >/dev/null 2>&1 || true
rm -rf "$pg_dir"
pg_cmd="scripts/dev-postgres.sh start $pg_dir $pg_port"
base=$($pg_cmd); base=${base%/clamp}
db=clamp_faults_$(date +%s)
pg_settings=$(pg_settings "$base" max_connections)

mock_cmd="$bin/clamp-bench mock --port $mock_port --threads 1 --delay $DELAY --fail-first-pct $FAIL_PCT --count-keys${MOCK_FLAGS:+ $MOCK_FLAGS}"
$mock_cmd >"$work/mock.log" 2>&1 &
mock_pid=$!
server_cmd="$bin/clamp --port $port --bind 127.0.0.1 --database-url $base/$db${LIMIT:+ --downstream-max-in-flight $LIMIT}${SERVER_FLAGS:+ $SERVER_FLAGS}"
$server_cmd >"$out/$tag-server.log" 2>&1 &
server_pid=$!
up() { curl -sf "localhost:$1/health" >/dev/null; }
for _ in $(seq 1 100); do up $port && up $mock_port && break; sleep 0.1; done
if ! up $port || ! up $mock_port; then
  echo "bench-faults: the server or the mock did not come up; server log:" >&2
  tail -20 "$out/$tag-server.log" >&2
  exit 1
fi

gen_cmd="$bin/clamp-bench faults --url http://127.0.0.1:$port --downstream http://127.0.0.1:$mock_port --requests $REQUESTS -c $CONNS --settle-timeout $SETTLE --check${LIMIT:+ --max-in-flight $LIMIT} --json $work/faults.json"
t0=$(date +%s.%N)
if [ "$PG_RESTART" = 1 ]; then
  # In the background, timed from the scenario's start; each moment is kept for the record.
  (
    sleep "$PG_AT"
    date +%s.%N >"$work/pg-stop"
    scripts/dev-postgres.sh stop "$pg_dir"
    date +%s.%N >"$work/pg-stopped"
    sleep "$PG_DOWN"
    $pg_cmd >/dev/null
    date +%s.%N >"$work/pg-started"
  ) &
  restart_pid=$!
fi
gen_rc=0
$gen_cmd || gen_rc=$?
t1=$(date +%s.%N)
if [ -n "$restart_pid" ]; then
  # A short run can end before the restart does; the counts below need Postgres back.
  wait "$restart_pid" || true
  restart_pid=
fi
[ -s "$work/faults.json" ] || { echo "bench-faults: the scenario wrote no result (exit $gen_rc)" >&2; exit 1; }

rows=$(psql "$base/$db" -Atc "select status, count(*) from service_requests group by 1 order by 1")
curl -s "localhost:$port/metrics" >"$out/$tag-metrics.txt" || true
at() { if [ -s "$work/$1" ]; then bm elapsed "$t0" "$(cat "$work/$1")" --fmt .1f; else echo "-"; fi; }
pg_events="stop sent at $(at pg-stop) s, down at $(at pg-stopped) s, up again at $(at pg-started) s"

# The record: the scenario's own JSON plus what only this script knows.
python3 - "$work/faults.json" "$out/$tag.json" "$rows" <<PY
import json, sys
j = json.load(open(sys.argv[1]))
rows = dict(line.split("|") for line in sys.argv[3].splitlines() if line)
j["run"] = {
    "tag": "$tag", "fail_first_pct": $FAIL_PCT, "mock_delay": "$DELAY",
    "downstream_max_in_flight": int("${LIMIT}") if "${LIMIT}" else None, "server_flags": "${SERVER_FLAGS:-}",
    "pg_restart": $PG_RESTART == 1, "pg_at_s": $PG_AT, "pg_down_s": $PG_DOWN,
    "pg_events": "$pg_events" if $PG_RESTART == 1 else None,
    "scenario_s": $(bm elapsed "$t0" "$t1" --fmt .2f), "scenario_exit": $gen_rc,
    "rows_by_status": {k: int(v) for k, v in rows.items()},
}
json.dump(j, open(sys.argv[2], "w"), indent=2)
open(sys.argv[2], "a").write("\n")
PY

git_rev=$(git_rev)
if [ "$git_rev" != none ] && ! git diff --quiet HEAD -- src perf Cargo.toml Cargo.lock; then
  git_rev+=" with uncommitted changes to src/, perf/ or Cargo"
fi
{
  echo "# Faults: $REQUESTS requests, $FAIL_PCT% first calls failed$([ "$PG_RESTART" = 1 ] && echo ", Postgres stopped for ${PG_DOWN} s")"
  echo
  echo "- $(machine_line)"
  echo "- git: $git_rev"
  echo "- Postgres: \`$pg_cmd\` (throwaway cluster); $pg_settings"
  echo "- mock: \`$mock_cmd\`"
  echo "- server: \`$server_cmd\`"
  echo "- scenario: \`$gen_cmd\` (exit $gen_rc)"
  if [ "$PG_RESTART" = 1 ]; then
    echo "- Postgres restart: \`scripts/dev-postgres.sh stop $pg_dir\` $PG_AT s into the scenario, \`$pg_cmd\` $PG_DOWN s later; $pg_events"
  fi
  echo "- everything (server, Postgres, mock, generator) shares the machine"
  echo
  python3 - "$out/$tag.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
kinds = lambda m: ", ".join(f"{k} {v:,}" for k, v in m.items()) or "none"
final = f"{j['all_final_s']:.1f} s" if j["all_final_s"] is not None else "not all final"
rows = [
    ("requests asked", f"{j['requests']:,}"),
    ("acknowledged", f"{j['acknowledged']:,}"),
    ("create attempts retried", kinds(j["create_retries"])),
    ("creates given up", kinds(j["create_rejected"])),
    ("COMPLETED", f"{j['completed']:,}"),
    ("FAILED", f"{j['failed']:,}"),
    ("pending at timeout (of which 404)", f"{j['pending']:,} ({j['missing']:,})"),
    ("status reads retried", kinds(j["read_errors"])),
    ("create phase", f"{j['create_s']:.1f} s, {j['create_rate']:,.0f}/s"),
    ("first create to all final", final),
    ("completed per second", f"{j['completed_rate']:,.0f}"),
    ("rows in Postgres by status", kinds(j["run"]["rows_by_status"])),
]
print("| | |\n|---|---|")
for k, v in rows:
    print(f"| {k} | {v} |")
if j["failed_sample"]:
    print("\nFailed, for example:\n")
for f in j["failed_sample"]:
    print(f"- `{f['id']}`: {f['reason']}")
print("\nMock `/stats` at the end:\n")
print("```json\n" + json.dumps(j["mock"], indent=2) + "\n```\n")
p = j["check_problems"]
print("Check: " + ("PASS" if p == [] else "FAIL: " + "; ".join(p or ["not run"])))
PY
} | tee "$out/$tag.md"
exit "$gen_rc"
