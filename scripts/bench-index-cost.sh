#!/usr/bin/env bash
# What indexes that a row does not enter cost the statements writing their table, on a
# throwaway Postgres with the settings of docs/configuration.md: a database migrated by
# BIN (A, every index) and a copy of it without the indexes DROP names (B). pgbench (one
# client, prepared statements, synchronous_commit off so that no fsync drowns the
# difference) runs one INSERT of ROWS rows of a plain request into service_requests per
# transaction, the two databases alternating, ROUNDS times, for ROWS 1, 17 and 34 (a
# create batch and a step-write batch at full load are about 17 and 34 rows). Reports µs
# per statement on each side (medians), and the difference per dropped index, per
# statement and per row: a cost per statement shows at 1 row, a cost per row grows with
# the rows. With WRITE=update, each transaction is instead a request's finishing update
# of ROWS rows (status, finish time and lease, a non-HOT update: status is in index
# predicates), aimed at the partition that holds them as the step writer's is, over rows
# inserted before the run (TRANSACTIONS of them per run instead of SECONDS_EACH).
# Writes perf/runs/<date>-<host>/<commit>-<tag>/<tag>.md.
#
#   BIN=target/release/clamp DROP=service_requests_labels,service_requests_fan_held scripts/bench-index-cost.sh
#
# Settings: BIN, DROP (comma-separated index names of the parent table), B_SQL (SQL run on
# B after the drop: an index in place of a dropped one, say), WRITE (insert or update),
# ROUNDS (3), SECONDS_EACH (8), TRANSACTIONS (3000), TAG (index-cost).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
BIN=${BIN:-target/release/clamp}
DROP=${DROP:?DROP names the indexes to drop, comma-separated}
ROUNDS=${ROUNDS:-3}
SECONDS_EACH=${SECONDS_EACH:-8}
WRITE=${WRITE:-insert}
TRANSACTIONS=${TRANSACTIONS:-3000}
case "$WRITE" in insert|update) ;; *) echo "bench-index-cost: WRITE is insert or update" >&2; exit 1 ;; esac
tag=${TAG:-index-cost}
[ -x "$BIN" ] || { echo "bench-index-cost: $BIN is not an executable" >&2; exit 1; }
need psql postgresql-client
need pgbench postgresql-15

out=$(bench_out "$tag")
tmp=$(mktemp -d /tmp/bench-index.XXXXXX)
pg_dir=$(mktemp -d /tmp/bench-index-pg.XXXXXX)
server_pid=''
cleanup() {
  stop "$server_pid"
  scripts/dev-postgres.sh stop "$pg_dir" >/dev/null 2>&1 || true
  rm -rf "$tmp" "$pg_dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

pg_port=$(free_port)
base=$(scripts/dev-postgres.sh start "$pg_dir" "$pg_port"); base=${base%/clamp}
dbsql() { PGOPTIONS='-c client_min_messages=warning' psql "$base/$1" -qAtX -v ON_ERROR_STOP=1 -c "$2"; }

# A: migrated by the server (its partition sets made ahead of now), then stopped.
fresh_db "$base" idx_a
port=$(free_port)
serve "$port" "$tmp/server.log" "$BIN" --port "$port" --bind 127.0.0.1 --database-url "$base/idx_a"
stop "$server_pid"
server_pid=''
dbsql postgres "CREATE DATABASE idx_b TEMPLATE idx_a"
dbsql idx_b "DROP INDEX $DROP"
[ -z "${B_SQL:-}" ] || dbsql idx_b "$B_SQL"
n_dropped=$(tr ',' '\n' <<< "$DROP" | grep -c .)
for db in idx_a idx_b; do
  dbsql "$db" "CREATE SEQUENCE bench_ids; CREATE SEQUENCE bench_done"
done
n_a=$(dbsql idx_a "SELECT count(*) FROM pg_indexes WHERE tablename = 'service_requests'")
n_b=$(dbsql idx_b "SELECT count(*) FROM pg_indexes WHERE tablename = 'service_requests'")
# Ids of now + 10 s (inside a set made ahead), in order, as UUIDv7 ids are.
ms=$(dbsql idx_a "SELECT (extract(epoch FROM now()) * 1000)::bigint + 10000")
for rows in 1 17 34; do
  cat > "$tmp/insert-$rows.sql" <<EOF
INSERT INTO service_requests (id, workflow_name, payload, headers, lease_owner, lease_until)
SELECT (lpad(to_hex(:ms::bigint), 12, '0') || '70008' || lpad(to_hex(nextval('bench_ids')), 15, '0'))::uuid,
       'two', '{"n":1}', '[]', '7a0b4a4e-1111-4c3b-9c1d-000000000001', now() + interval '30 s'
FROM generate_series(1, $rows);
EOF
done
# The id of the n-th row, as the insert made it.
id_of="(lpad(to_hex($ms::bigint), 12, '0') || '70008' || lpad(to_hex(nextval('bench_done')), 15, '0'))::uuid"

# once DB ROWS: µs per statement of one pgbench run on a truncated table.
once() {
  dbsql "$1" "TRUNCATE service_requests; SELECT setval('bench_ids', 1, false), setval('bench_done', 1, false)" >/dev/null
  local run=(-T "$SECONDS_EACH") script=$tmp/insert-$2.sql
  if [ "$WRITE" = update ]; then
    # The rows the run finishes, inserted first; the statement names their partition.
    dbsql "$1" "INSERT INTO service_requests (id, workflow_name, payload, headers, lease_owner, lease_until)
      SELECT (lpad(to_hex($ms::bigint), 12, '0') || '70008' || lpad(to_hex(nextval('bench_ids')), 15, '0'))::uuid,
             'two', '{\"n\":1}', '[]', '7a0b4a4e-1111-4c3b-9c1d-000000000001', now() + interval '30 s'
      FROM generate_series(1, $((TRANSACTIONS * $2)))"
    local leaf
    leaf=$(dbsql "$1" "SELECT tableoid::regclass FROM service_requests LIMIT 1")
    cat > "$tmp/update-$1-$2.sql" <<EOF
UPDATE $leaf SET status = 'COMPLETED', current_step_id = 2, finished_at = now(), updated_at = now(),
       lease_owner = NULL, lease_until = '-infinity'
WHERE id IN (SELECT $id_of FROM generate_series(1, $2));
EOF
    run=(-t "$TRANSACTIONS")
    script=$tmp/update-$1-$2.sql
  fi
  dbsql "$1" "VACUUM ANALYZE service_requests" >/dev/null
  dbsql "$1" "CHECKPOINT" >/dev/null
  PGOPTIONS='-c synchronous_commit=off -c enable_seqscan=off' pgbench "$base/$1" -n -M prepared -c 1 "${run[@]}" \
    -D ms="$ms" -f "$script" 2>/dev/null | awk '/latency average/ { print $4 * 1000 }'
}

for r in $(seq 1 "$ROUNDS"); do
  for rows in 1 17 34; do
    for side in $(ab_order "$r"); do
      db=idx_a
      [ "$side" = B ] && db=idx_b
      echo "$rows $side $(once "$db" "$rows")" >> "$tmp/results"
    done
  done
done

{
  echo "# What indexes no row enters cost the statements writing their table ($tag)"
  echo
  machine_line
  echo
  echo "Command: \`BIN=$BIN DROP=$DROP${B_SQL:+ B_SQL=\"$B_SQL\"} WRITE=$WRITE ROUNDS=$ROUNDS SECONDS_EACH=$SECONDS_EACH TRANSACTIONS=$TRANSACTIONS scripts/bench-index-cost.sh\`"
  echo "(README's Postgres: scripts/dev-postgres.sh, $(pg_settings "$base");"
  echo "A: service_requests as migrated by the binary, $n_a indexes; B: without $n_dropped of them${B_SQL:+, then \`$B_SQL\`}, $n_b;"
  if [ "$WRITE" = update ]; then
    echo "pgbench -n -M prepared -c 1 -t $TRANSACTIONS, synchronous_commit off, one finishing UPDATE of ROWS rows per"
    echo "transaction aimed at their partition, over rows inserted before each run; rounds alternate A and B)"
  else
    echo "pgbench -n -M prepared -c 1 -T $SECONDS_EACH, synchronous_commit off, one INSERT of ROWS rows per transaction (enable_seqscan off, as the server's sessions),"
    echo "the table truncated before each run; rounds alternate A and B)"
  fi
  echo
  echo "| rows per statement | round | A µs | B µs |"
  echo "|---|---|---|---|"
  awk '{ k = $1; n[k $2]++; print k, n[k $2], $2, $3 }' "$tmp/results" | sort -k1,1n -k2,2n -k3,3 |
    awk '{ if ($3 == "A") a = $4; else b = $4; if (++c % 2 == 0) { printf "| %s | %s | %s | %s |\n", $1, $2, a, b } }'
  echo
  echo "| rows per statement | A median µs | B median µs | A − B µs | per dropped index µs | per index per row µs |"
  echo "|---|---|---|---|---|---|"
  for rows in 1 17 34; do
    # shellcheck disable=SC2046
    a=$(bm median $(awk -v r="$rows" '$1 == r && $2 == "A" { print $3 }' "$tmp/results"))
    # shellcheck disable=SC2046
    b=$(bm median $(awk -v r="$rows" '$1 == r && $2 == "B" { print $3 }' "$tmp/results"))
    python3 -c "a, b, n, r = $a, $b, $n_dropped, $rows
print(f'| {r} | {a:.0f} | {b:.0f} | {a - b:.1f} | {(a - b) / n:.2f} | {(a - b) / n / r:.3f} |')"
  done
} > "$out/$tag.md"
cat "$out/$tag.md"
