#!/usr/bin/env bash
# What the request table's row triggers (migrations 34, 35) and the insert's routing cost a
# plain request's writes, on a throwaway Postgres with the settings of docs/configuration.md:
# one database as BIN migrates it (A) and a copy without the three slot triggers (B).
# pgbench (one client, prepared, synchronous_commit off) runs, alternating, ROUNDS times:
#   insert-parent: one INSERT of ROWS plain rows into service_requests (routed), on A and on B
#   insert-leaf:   the same aimed at the partition that holds them, on A
#   update:        the finishing UPDATE of ROWS rows (status, lease, finish time: not HOT)
#                  aimed at their partition, on A and on B, over rows inserted before
set -euo pipefail
cd "$(dirname "$0")/../../../.."
. scripts/bench-lib.sh
BIN=${BIN:?BIN is the server binary}
ROUNDS=${ROUNDS:-5}; SECONDS_EACH=${SECONDS_EACH:-8}; ROWS=${ROWS:-16}; TRANSACTIONS=${TRANSACTIONS:-3000}
tmp=$(mktemp -d /tmp/trigb.XXXXXX); pg_dir=$(mktemp -d /tmp/trigb-pg.XXXXXX); server_pid=''
cleanup() { stop "$server_pid"; scripts/dev-postgres.sh stop "$pg_dir" >/dev/null 2>&1 || true; rm -rf "$tmp" "$pg_dir"; }
trap cleanup EXIT
pg_port=$(free_port)
base=$(scripts/dev-postgres.sh start "$pg_dir" "$pg_port"); base=${base%/clamp}
dbsql() { PGOPTIONS='-c client_min_messages=warning' psql "$base/$1" -qAtX -v ON_ERROR_STOP=1 -c "$2"; }
fresh_db "$base" ta
port=$(free_port)
serve "$port" "$tmp/server.log" "$BIN" --port "$port" --bind 127.0.0.1 --database-url "$base/ta"
stop "$server_pid"; server_pid=''
dbsql postgres "CREATE DATABASE tb TEMPLATE ta"
dbsql tb "DROP TRIGGER concurrency_slots_insert ON service_requests; DROP TRIGGER concurrency_slots_update ON service_requests; DROP TRIGGER concurrency_slots_delete ON service_requests"
for db in ta tb; do dbsql $db "CREATE SEQUENCE bench_ids; CREATE SEQUENCE bench_done"; done
ms=$(dbsql ta "SELECT (extract(epoch FROM now()) * 1000)::bigint + 10000")
id="(lpad(to_hex($ms::bigint), 12, '0') || '70008' || lpad(to_hex(nextval('bench_ids')), 15, '0'))::uuid"
done_id="(lpad(to_hex($ms::bigint), 12, '0') || '70008' || lpad(to_hex(nextval('bench_done')), 15, '0'))::uuid"
dbsql ta "INSERT INTO service_requests (id, workflow_name, payload, headers, lease_until) SELECT $id, 'two', '{}', '[]', '-infinity'"
leaf=$(dbsql ta "SELECT tableoid::regclass FROM service_requests LIMIT 1")
for t in service_requests $leaf; do
  cat > "$tmp/insert-$t.sql" <<SQL
INSERT INTO $t (id, workflow_name, payload, headers, lease_owner, lease_until)
SELECT $id, 'two', '{"n":1}', '[]', '7a0b4a4e-1111-4c3b-9c1d-000000000001', now() + interval '30 s'
FROM generate_series(1, $ROWS);
SQL
done
cat > "$tmp/update.sql" <<SQL
UPDATE $leaf SET status = 'COMPLETED', current_step_id = 2, finished_at = now(), updated_at = now(),
       lease_owner = NULL, lease_until = '-infinity'
WHERE id IN (SELECT $done_id FROM generate_series(1, $ROWS));
SQL
once() {  # once DB KIND(insert-parent|insert-leaf|update)
  dbsql "$1" "TRUNCATE service_requests; SELECT setval('bench_ids', 1, false), setval('bench_done', 1, false)" >/dev/null
  local run=(-T "$SECONDS_EACH") script
  case $2 in
    insert-parent) script=$tmp/insert-service_requests.sql ;;
    insert-leaf) script=$tmp/insert-$leaf.sql ;;
    update)
      dbsql "$1" "INSERT INTO service_requests (id, workflow_name, payload, headers, lease_owner, lease_until)
        SELECT $id, 'two', '{\"n\":1}', '[]', '7a0b4a4e-1111-4c3b-9c1d-000000000001', now() + interval '30 s'
        FROM generate_series(1, $((TRANSACTIONS * ROWS)))"
      run=(-t "$TRANSACTIONS"); script=$tmp/update.sql ;;
  esac
  dbsql "$1" "VACUUM ANALYZE service_requests" >/dev/null
  dbsql "$1" "CHECKPOINT" >/dev/null
  PGOPTIONS='-c synchronous_commit=off -c enable_seqscan=off' pgbench "$base/$1" -n -M prepared -c 1 "${run[@]}" \
    -f "$script" 2>/dev/null | awk '/latency average/ { print $4 * 1000 }'
}
for r in $(seq 1 "$ROUNDS"); do
  cases="ta:insert-parent tb:insert-parent ta:insert-leaf ta:update tb:update"
  [ $((r % 2)) = 0 ] && cases="tb:update ta:update ta:insert-leaf tb:insert-parent ta:insert-parent"
  for c in $cases; do
    echo "${c%%:*} ${c#*:} $(once "${c%%:*}" "${c#*:}")" | tee -a "$tmp/results"
  done
done
echo "# medians, µs per statement of $ROWS rows (ta: as migrated; tb: without the slot triggers)"
for c in ta:insert-parent tb:insert-parent ta:insert-leaf ta:update tb:update; do
  m=$(awk -v d="${c%%:*}" -v k="${c#*:}" '$1==d && $2==k {print $3}' "$tmp/results" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  echo "$c $m"
done
