#!/usr/bin/env bash
# Search on a large table: ROWS service requests (default 1,000,000) spread over the last
# 24 hours across four workflows (90% COMPLETED, 5% FAILED, 3% CANCELLED, 2% NEW), written
# straight into a throwaway Postgres with the settings of docs/configuration.md, then an API-only server
# on it. For each query: the plan of the server's statement (EXPLAIN ANALYZE, BUFFERS) and
# the time of the HTTP request (median of REPS), for the first page and for a page deep
# in the table (its cursor half-way down). Writes perf/runs/<date>-<host>/<commit>-<tag>/<tag>.md.
#
#   scripts/bench-search.sh
#   ROWS=200000 REPS=10 TAG=search-small scripts/bench-search.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
ROWS=${ROWS:-1000000}
REPS=${REPS:-20}
bin=${BIN:-target/release}
[ -n "${BIN:-}" ] || cargo build --release --bin clamp -q
tag=${TAG:-search-1m}
out=$(bench_out "$tag")
pg_dir=/tmp/clamp-bench-search-pg
base=$(scripts/dev-postgres.sh start $pg_dir 55499); base=${base%/clamp}
db=clamp_bench_search
port=18540
server_on_large_table "$bin" "$pg_dir" "$base" "$db" "$port" "$tag" "$ROWS"
n=$(psql "$base/$db" -Atc "select count(*) from service_requests")
mid=$(psql "$base/$db" -Atc "select replace(id::text, '-', '') from service_requests order by id desc offset $((ROWS / 2)) limit 1")
hour_ago=$(psql "$base/$db" -Atc "select to_char((now() - interval '1 hour') at time zone 'utc', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')")
queries=(
  ""
  "workflow=claims"
  "status=FAILED"
  "status=FAILED&createdAfter=$hour_ago"
  "status=FAILED&workflow=refunds"
  "workflow=rare"
  "status=FAILED&workflow=rare"
  "status=COMPLETED"
  "cursor=$mid"
  "workflow=claims&cursor=$mid"
  "workflow=rare&cursor=$mid"
  "status=FAILED&cursor=$mid"
)
# LABELS=1 (load_rows): a label one request carries, one a twentieth carry, the two
# together, and the common one with a status, a workflow and from half-way down.
if [ "${LABELS:-0}" = 1 ]; then
  order=$((ROWS / 4))
  queries+=(
    "label=order:$order"
    "label=tenant:t3"
    "label=tenant:t$(( (order * 2 % 20) / 2 ))&label=order:$order"
    "label=tenant:t3&status=FAILED"
    "label=tenant:t3&workflow=claims"
    "label=tenant:t3&cursor=$mid"
  )
fi
# The server's statements, as store/search.rs sends them: EXPLAIN runs those for any
# workflow with a generic plan (they are prepared once per connection) and those for a
# workflow with a plan for their values (they are planned for each search).
derived="CASE WHEN s.status = 'NEW' AND (s.current_step_id > 0 OR s.lease_until > now()) THEN 'IN_PROGRESS' ELSE s.status END"
stmt() {  # stmt <name> <workflow condition> [<extra parameter type> <order>]
  echo "PREPARE $1 (uuid, uuid, text[], timestamptz, timestamptz, bigint${3:-}) AS SELECT s.id, s.workflow_name, $derived AS status, to_json(s.created_at) #>> '{}' AS created_at, s.payload, s.current_step_id, s.reason
FROM service_requests s WHERE $2 s.id >= \$1 AND s.id < \$2
  AND (\$3::text[] IS NULL OR $derived = ANY(\$3))
  AND (\$4::timestamptz IS NULL OR s.created_at > \$4) AND (\$5::timestamptz IS NULL OR s.created_at < \$5)
ORDER BY ${4:-s.id DESC} LIMIT \$6;"
}
ms_uuid() { python3 -c "import sys; ms=int(sys.argv[1]); print('%012x' % ms + '7000' + '8000' + '0'*12)" "$1"; }
{
  echo "# Search on $n rows"
  echo
  echo "- $(machine_line)"
  echo "- git: $(git_rev)"
  echo "- data: $n rows over the last 24 h, four workflows, 90% COMPLETED, 5% FAILED, 3% CANCELLED, 2% NEW (scripts/bench-search.sh)$([ "${LABELS:-0}" = 1 ] && echo "; every other row labelled order:<n> (its own) and tenant:t0..t9 (a twentieth of all rows each), LABELS=1"); VACUUM ANALYZE after loading"
  echo "- server: \`$bin/clamp --port $port --bind 127.0.0.1 --database-url …/$db --max-running 0\`; Postgres: throwaway cluster from \`scripts/dev-postgres.sh\`: $(pg_settings "$base")"
  echo "- time: curl's time_total of \`GET /serviceRequests?<query>\` (limit 50), median of $REPS, after one warm-up call"
  echo
  echo "| query | items | next page | median ms | p90 ms |"
  echo "|---|---|---|---|---|"
  for q in "${queries[@]}"; do
    curl -s "localhost:$port/serviceRequests?$q" >/dev/null
    times=$(for _ in $(seq 1 "$REPS"); do curl -s -o /dev/null -w '%{time_total}\n' "localhost:$port/serviceRequests?$q"; done)
    body=$(curl -s "localhost:$port/serviceRequests?$q")
    python3 - "$q" "$body" "$times" <<'EOF'
import json, sys
sys.path.insert(0, "scripts")
from benchmath import median, p90
q, body, times = sys.argv[1], json.loads(sys.argv[2]), [float(t) * 1000 for t in sys.argv[3].split()]
times.sort()
print(f"| `{q or '(none)'}` | {len(body['serviceRequests'])} | {'yes' if body['nextCursor'] else 'no'} | {median(times):.2f} | {p90(times):.2f} |")
EOF
  done
  echo
  echo "Plans (the statement of store/search.rs with the query's values; \`EXPLAIN (ANALYZE, BUFFERS)\`, seqscan off as in the server's sessions):"
  hour_ms=$(python3 -c "import datetime,sys; print(int((datetime.datetime.strptime(sys.argv[1], '%Y-%m-%dT%H:%M:%SZ').replace(tzinfo=datetime.timezone.utc).timestamp() - 1) * 1000))" "$hour_ago")
  prepared="SET enable_seqscan = off; SET plan_cache_mode = force_generic_plan; $(stmt search_all "") $(stmt search_wf 's.workflow_name = $7 AND' ', text') $(stmt search_bad "s.status IN ('FAILED', 'CANCELLED') AND") $(stmt search_bad_wf "s.status IN ('FAILED', 'CANCELLED') AND s.workflow_name = \$7 AND" ', text')"
  # A label search: the newest 2,000 requests first (search_labels_recent_wf), then, when
  # they did not fill the page, every match through the labels' index (search_labels_wf).
  lab='s.labels @> $8::text[] AND ($7::text IS NULL OR s.workflow_name = $7) AND'
  [ "${LABELS:-0}" = 1 ] && prepared="$prepared $(stmt search_labels_recent_wf "$lab s.id >= coalesce((SELECT w.id FROM service_requests w WHERE w.id >= \$1 AND w.id < \$2 ORDER BY w.id DESC OFFSET 1999 LIMIT 1), \$1) AND" ', text, text[]') $(stmt search_labels_wf "$lab" ', text, text[]' 'uuid_send(s.id) DESC')"
  plan() {  # plan <label> <EXECUTE …>
    echo; echo "\`$1\`:"; echo; echo '```'
    local mode=""
    case "$2" in *_wf*) mode="SET plan_cache_mode = force_custom_plan;" ;; esac
    psql "$base/$db" -qAt -c "$prepared $mode EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) $2"
    echo '```'
  }
  nil=00000000-0000-0000-0000-000000000000; max=ffffffff-ffff-ffff-ffff-ffffffffffff
  plan "(none)" "EXECUTE search_all('$nil', '$max', NULL, NULL, NULL, 51)"
  plan "workflow=claims" "EXECUTE search_wf('$nil', '$max', NULL, NULL, NULL, 51, 'claims')"
  plan "workflow=rare" "EXECUTE search_wf('$nil', '$max', NULL, NULL, NULL, 51, 'rare')"
  plan "status=FAILED" "EXECUTE search_bad('$nil', '$max', '{FAILED}', NULL, NULL, 51)"
  plan "status=FAILED&createdAfter=<an hour ago>" "EXECUTE search_bad('$(ms_uuid "$hour_ms")', '$max', '{FAILED}', '$hour_ago', NULL, 51)"
  plan "status=FAILED&workflow=refunds" "EXECUTE search_bad_wf('$nil', '$max', '{FAILED}', NULL, NULL, 51, 'refunds')"
  plan "status=FAILED&workflow=rare" "EXECUTE search_bad_wf('$nil', '$max', '{FAILED}', NULL, NULL, 51, 'rare')"
  plan "status=COMPLETED" "EXECUTE search_all('$nil', '$max', '{COMPLETED}', NULL, NULL, 51)"
  plan "cursor=<half-way>" "EXECUTE search_all('$nil', '$mid', NULL, NULL, NULL, 51)"
  plan "workflow=rare&cursor=<half-way>" "EXECUTE search_wf('$nil', '$mid', NULL, NULL, NULL, 51, 'rare')"
  if [ "${LABELS:-0}" = 1 ]; then
    plan "label=order:$order (the newest 2,000)" "EXECUTE search_labels_recent_wf('$nil', '$max', NULL, NULL, NULL, 51, NULL, '{order:$order}')"
    plan "label=tenant:t3 (the newest 2,000)" "EXECUTE search_labels_recent_wf('$nil', '$max', NULL, NULL, NULL, 51, NULL, '{tenant:t3}')"
    plan "label=order:$order" "EXECUTE search_labels_wf('$nil', '$max', NULL, NULL, NULL, 51, NULL, '{order:$order}')"
    plan "label=tenant:t3" "EXECUTE search_labels_wf('$nil', '$max', NULL, NULL, NULL, 51, NULL, '{tenant:t3}')"
    plan "label=tenant:t3&status=FAILED" "EXECUTE search_labels_wf('$nil', '$max', '{FAILED}', NULL, NULL, 51, NULL, '{tenant:t3}')"
    plan "label=tenant:t3&cursor=<half-way>" "EXECUTE search_labels_wf('$nil', '$mid', NULL, NULL, NULL, 51, NULL, '{tenant:t3}')"
  fi
} | tee "$out/$tag.md"
