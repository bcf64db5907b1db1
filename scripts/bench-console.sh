#!/usr/bin/env bash
# The console and the counts on a large table: ROWS service requests (default 1,000,000)
# over the last 24 hours (scripts/bench-lib.sh load_rows: about 41,700 an hour), in a
# throwaway Postgres with the settings of docs/configuration.md, an API-only server on it. For each page
# of the console and each counts query: the HTTP time (median and p90 of REPS, after one
# warm-up call), and the plan of the counts statement for an hour and for a day.
# Writes perf/runs/<date>-<host>/<commit>-<tag>/<tag>.md.
#
#   scripts/bench-console.sh
#   ROWS=200000 REPS=5 TAG=console-small scripts/bench-console.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
ROWS=${ROWS:-1000000}
REPS=${REPS:-10}
bin=${BIN:-target/release}
[ -n "${BIN:-}" ] || cargo build --release --bin clamp -q
tag=${TAG:-console-1m}
out=$(bench_out "$tag")
pg_dir=/tmp/clamp-bench-console-pg
base=$(scripts/dev-postgres.sh start $pg_dir 55498); base=${base%/clamp}
db=clamp_bench_console
port=18541
server_on_large_table "$bin" "$pg_dir" "$base" "$db" "$port" "$tag" "$ROWS"
n=$(psql "$base/$db" -Atc "select count(*) from service_requests")
in_hour=$(psql "$base/$db" -Atc "select count(*) from service_requests where created_at > now() - interval '1 hour'")
failed=$(psql "$base/$db" -Atc "select id from service_requests where status = 'FAILED' order by id desc limit 1")
utc() { psql "$base/$db" -qAtc "select to_char((now() - interval '$1') at time zone 'utc', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"; }
six_ago=$(utc '6 hours'); day_ago=$(utc '23 hours 59 minutes')
paths=(
  "/serviceRequestCounts"
  "/serviceRequestCounts?workflow=claims"
  "/serviceRequestCounts?workflow=rare"
  "/serviceRequestCounts?createdAfter=$six_ago"
  "/serviceRequestCounts?createdAfter=$day_ago"
  "/console"
  "/console?status=FAILED"
  "/console?workflow=claims&status=FAILED"
  "/console?createdAfter=$day_ago"
  "/console/serviceRequests/$failed"
  "/console/workflows"
  "/console/workflows/claims"
)
{
  echo "# Console and counts on $n rows"
  echo
  echo "- $(machine_line)"
  echo "- git: $(git_rev)"
  echo "- data: $n rows over the last 24 h ($in_hour in the last hour), four workflows and a rare one, 90% COMPLETED, 5% FAILED, 3% CANCELLED, 2% NEW (scripts/bench-console.sh); VACUUM ANALYZE after loading"
  echo "- server: \`$bin/clamp --port $port --bind 127.0.0.1 --database-url …/$db --max-running 0\`; Postgres: throwaway cluster from \`scripts/dev-postgres.sh\`: $(pg_settings "$base")"
  echo "- time: curl's time_total, median and p90 of $REPS, after one warm-up call"
  echo
  echo "| path | status | bytes | median ms | p90 ms |"
  echo "|---|---|---|---|---|"
  for p in "${paths[@]}"; do
    curl -s -o /dev/null "localhost:$port$p"
    res=$(curl -s -o /dev/null -w '%{http_code} %{size_download}' "localhost:$port$p")
    times=$(for _ in $(seq 1 "$REPS"); do curl -s -o /dev/null -w '%{time_total}\n' "localhost:$port$p"; done)
    python3 - "$p" "$res" "$times" <<'PY'
import sys
sys.path.insert(0, "scripts")
from benchmath import median, p90
p, res, times = sys.argv[1], sys.argv[2].split(), sorted(float(t) * 1000 for t in sys.argv[3].split())
p = p.replace(sys.argv[1].split("createdAfter=")[-1], "<t>") if "createdAfter=" in p else p
print(f"| `{p}` | {res[0]} | {res[1]} | {median(times):.1f} | {p90(times):.1f} |")
PY
  done
  echo
  echo "Plans of the counts statement (store/stats.rs, seqscan off as in the server's sessions):"
  derived="CASE WHEN s.status = 'NEW' AND (s.current_step_id > 0 OR s.lease_until > now()) THEN 'IN_PROGRESS' ELSE s.status END"
  for w in "1 hour|NULL" "1 hour|'claims'" "23 hours 59 minutes|NULL"; do
    span=${w%|*}; wf=${w#*|}
    echo; echo "\`last $span, workflow $wf\`:"; echo; echo '```'
    psql "$base/$db" -qAt -c "SET enable_seqscan = off; EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
      SELECT extract(epoch FROM date_trunc('minute', s.created_at))::bigint AS minute, $derived AS status, count(*)
      FROM service_requests s
      WHERE s.id >= (lpad(to_hex((extract(epoch FROM now() - interval '$span') * 1000 - 1000)::bigint), 12, '0') || '70008000000000000000')::uuid
        AND s.id < 'ffffffff-ffff-ffff-ffff-ffffffffffff' AND s.created_at > now() - interval '$span' AND s.created_at < now()
        AND ($wf::text IS NULL OR s.workflow_name = $wf) GROUP BY 1, 2 ORDER BY 1, 2"
    echo '```'
  done
} | tee "$out/$tag.md"
