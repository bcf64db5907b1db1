#!/usr/bin/env bash
# What an upgrade to the partitioned layout (migration 25) does to a database in use: a
# database as the release before left it (its schema made by OLD_BIN, a server from
# before migration 25), holding ROWS finished requests and their step records, is
# opened by BIN (the new release) while creates arrive at RATE per second (clamp-bench's
# open loop, one step against nginx), and the conversion is watched: when each step of it
# happened (bound chosen, validated, swapped), creates refused and their latency during it,
# and every request counted before and after. On the README's Postgres (a throwaway
# cluster from scripts/dev-postgres.sh). Writes perf/runs/<date>-<host>/<commit>-<tag>/README.md.
#
#   OLD_BIN=/tmp/bins/clamp-212db38 BIN=target/release/clamp ROWS=20000000 scripts/bench-upgrade.sh
#
# Settings: OLD_BIN, BIN, ROWS (20000000), RATE (500), BENCH_BIN
# (target/release/clamp-bench), TAG (upgrade).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
: "${OLD_BIN:?OLD_BIN=a server binary from before migration 25}" "${BIN:?BIN=the new server binary}"
ROWS=${ROWS:-20000000}
RATE=${RATE:-500}
BENCH_BIN=${BENCH_BIN:-target/release/clamp-bench}
tag=${TAG:-upgrade}
need nginx nginx
need psql postgresql-client

out=$(bench_out "$tag")
tmp=$(mktemp -d /tmp/bench-upgrade.XXXXXX)
chmod 755 "$tmp"
pg_dir=$(mktemp -d /tmp/bench-upgrade-pg.XXXXXX)
server_pid='' nginx_pid='' gen_pid=''
cleanup() {
  stop "$gen_pid" "$server_pid" "$nginx_pid"
  scripts/dev-postgres.sh stop "$pg_dir" >/dev/null 2>&1 || true
  rm -rf "$tmp" "$pg_dir"
}
trap cleanup EXIT
pg_port=$(free_port)
base=$(scripts/dev-postgres.sh start "$pg_dir" "$pg_port"); base=${base%/clamp}
url="$base/clamp_upgrade"
q() { psql "$url" -qAtX -v ON_ERROR_STOP=1 -c "$1"; }
now() { date +%s.%N; }

nginx_port=$(free_port)
mkdir -p "$tmp/nginx/logs"
start_nginx "$tmp/nginx" "server { listen 127.0.0.1:$nginx_port; location / { default_type application/json; return 200 '{\"ok\":true}'; } }"
port=$(free_port)

# The old release makes the schema (its migrations, up to 24) and the workflow.
serve "$port" "$tmp/old.log" "$OLD_BIN" --port "$port" --bind 127.0.0.1 --database-url "$url"
curl -sf -o /dev/null -X POST -H 'Content-Type: application/json' \
  -d "{\"name\":\"two\",\"steps\":[{\"name\":\"a\",\"mode\":\"HTTP\",\"val\":{\"method\":\"POST\",\"url\":\"http://127.0.0.1:$nginx_port/a\"}}]}" \
  "http://127.0.0.1:$port/workflow"
stop "$server_pid"; server_pid=
echo "loading $ROWS requests"
t_load=$(now)
chunk=1000000
done_=0
while [ "$done_" -lt "$ROWS" ]; do
  n=$((ROWS - done_ < chunk ? ROWS - done_ : chunk))
  q "WITH r AS (
       SELECT (lpad(to_hex((extract(epoch FROM t) * 1000)::bigint), 12, '0') || '7' ||
               substr(md5(g::text), 1, 3) || '8' || substr(md5(g::text), 4, 15))::uuid AS id, t
       FROM (SELECT g, now() - interval '30 days' + g * (interval '30 days' / $ROWS) AS t
             FROM generate_series($((done_ + 1)), $((done_ + n))) g) s
     ), ins AS (
       INSERT INTO service_requests (id, workflow_name, status, payload, headers, current_step_id,
           created_at, updated_at, finished_at, workflow_version)
       SELECT id, 'two', 'COMPLETED', '{\"n\":1}', '[]', 0, t, t, t, 1 FROM r)
     INSERT INTO steps_status (service_request_id, step_id, step_name, status, request, response,
         started_at, finished_at, time_taken_ms, attempts)
     SELECT id, k, 'a', 'COMPLETED', '', '{\"ok\":true}', t, t, 1, 1 FROM r, generate_series(1, 2) k" >/dev/null
  done_=$((done_ + n))
  echo "  $done_"
done
q "VACUUM ANALYZE service_requests" >/dev/null
q "VACUUM ANALYZE steps_status" >/dev/null
load_s=$(bm elapsed "$t_load" "$(now)" --fmt .0f)
heap=$(q "SELECT pg_size_pretty(sum(pg_relation_size(t))) FROM unnest(ARRAY['service_requests', 'steps_status']) t")
total=$(q "SELECT pg_size_pretty(sum(pg_total_relation_size(t))) FROM unnest(ARRAY['service_requests', 'steps_status']) t")
count_before=$(q "SELECT count(*) FROM service_requests")
steps_before=$(q "SELECT count(*) FROM steps_status")

# The new release opens it, creates arriving all along.
t0=$(now)
serve "$port" "$tmp/new.log" "$BIN" --port "$port" --bind 127.0.0.1 --database-url "$url"
t_up=$(now)
# Creates in windows of 20 s, one after the other, each reporting its latency and errors.
gen_cmd="$BENCH_BIN create --url http://127.0.0.1:$port --workflow two --rate $RATE -d 20s --warmup 0s -c 64 -t 1 -q"
(
  i=0
  while [ ! -f "$tmp/stop" ]; do
    i=$((i + 1))
    # shellcheck disable=SC2086
    $gen_cmd --json "$tmp/gen-$i.json" > "$tmp/gen-$i.txt" 2>&1 || true
    echo "$(date +%s) $i" >> "$tmp/windows"
  done
) &
gen_pid=$!
# Each step of the conversion, by the catalog.
t_bound='' t_valid='' t_swap=''
while :; do
  st=$(q "SELECT (SELECT count(*) FROM pg_constraint WHERE conname = 'clamp_p0_bound'),
                 (SELECT count(*) FROM pg_constraint WHERE conname = 'clamp_p0_bound' AND convalidated),
                 (SELECT relkind FROM pg_class WHERE relname = 'service_requests')")
  IFS='|' read -r nb nv kind <<<"$st"
  [ -n "$t_bound" ] || { [ "$nb" -gt 0 ] || [ "$kind" = p ]; } && t_bound=${t_bound:-$(now)}
  [ -n "$t_valid" ] || { [ "$nv" -ge 4 ] || [ "$kind" = p ]; } && t_valid=${t_valid:-$(now)}
  if [ "$kind" = p ]; then t_swap=$(now); break; fi
  if [ "$(bm elapsed "$t0" "$(now)" --fmt .0f)" -gt 7200 ]; then echo "bench-upgrade: no swap within 2 h" >&2; break; fi
  sleep 0.5
done
sleep 30
touch "$tmp/stop"
wait "$gen_pid" || true; gen_pid=
bound=$(grep -o 'bound=[0-9a-f-]*' "$tmp/new.log" | head -1 | cut -d= -f2)
count_after=$(q "SELECT count(*) FROM service_requests WHERE created_at < to_timestamp(${t0%.*})")
steps_after=$(q "SELECT count(*) FROM steps_status WHERE started_at < to_timestamp(${t0%.*})")
sets=$(q "SELECT count(*) FROM pg_inherits WHERE inhparent = 'service_requests'::regclass")
python3 - "$tmp" > "$out/creates.md" <<'PY'
import glob, json, os, sys
tmp = sys.argv[1]
print("| window (20 s each) | creates/s | p50 ms | p99 ms | max ms | errors |")
print("|---|---|---|---|---|---|")
for f in sorted(glob.glob(f"{tmp}/gen-*.json"), key=lambda p: int(p.rsplit('-', 1)[1].split('.')[0])):
    j = json.load(open(f))
    lat = j.get("latency_us") or {}
    ms = lambda k: f"{lat[k] / 1000:.1f}" if isinstance(lat.get(k), (int, float)) else "n/a"
    n = f.rsplit('-', 1)[1].split('.')[0]
    errors = sum(j.get("errors", {}).values())
    print(f"| {n} | {j.get('achieved_rate', 0):,.0f} | {ms('p50')} | {ms('p99')} | {ms('max')} | {errors} |")
PY
grep -iE "partition|error|warn" "$tmp/new.log" | head -40 > "$out/server-log-excerpt.txt" || true
{
  echo "# Upgrading $ROWS requests to the partitioned layout (migration 25), online"
  echo
  echo "- $(machine_line); commit $(git_rev)"
  echo "- command: \`OLD_BIN=$OLD_BIN BIN=$BIN ROWS=$ROWS RATE=$RATE scripts/bench-upgrade.sh\`"
  echo "- Postgres: \`scripts/dev-postgres.sh start <tmpdir> <port>\` (the README's), $(pg_settings "$base")"
  echo "- the database: $ROWS finished requests over 30 days and $steps_before step records, made by the old release's schema and loaded in ${load_s} s; heap $heap, with indexes $total"
  echo "- creates during it: \`$BENCH_BIN create --rate $RATE\` (open loop) against the new server"
  echo
  echo "| step | seconds after the new server started |"
  echo "|---|---|"
  echo "| serving (migrations, the first pass) | $(bm elapsed "$t0" "$t_up" --fmt .1f) |"
  echo "| bound chosen (CHECK NOT VALID on the four tables) | $(bm elapsed "$t0" "${t_bound:-$t_swap}" --fmt .1f) |"
  echo "| bounds validated (a read of each table, writes going on) | $(bm elapsed "$t0" "${t_valid:-$t_swap}" --fmt .1f) |"
  echo "| swapped (partitioned; one short transaction) | $(bm elapsed "$t0" "${t_swap:-$(now)}" --fmt .1f) |"
  echo
  echo "- the first partition's bound: $bound; sets at the end: $sets"
  echo "- requests before: $count_before, after: $count_after; step records before: $steps_before, after: $steps_after"
  echo "- creates, by window of 20 s (\`$gen_cmd\`):"
  echo
  cat "$out/creates.md"
} > "$out/README.md"
cat "$out/README.md"
