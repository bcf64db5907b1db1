#!/usr/bin/env bash
# The two layouts issue 45 named, side by side, for what a request's writes cost as the
# history grows: a two-step request's rows written as clamp writes them (an insert, an
# update per step, two step records), with pgbench's `-M prepared` on the README's
# Postgres (a throwaway cluster from scripts/dev-postgres.sh), for MINUTES minutes each:
#
#   partitions: one `requests` table range-partitioned by the UUIDv7 id, one partition
#               per WIDTH seconds created ahead, the rows staying where they were written;
#   hot+history: a `hot` table of unfinished requests (plain, fillfactor 50) and a
#               `history` table range-partitioned the same way: the finishing update
#               becomes a delete from `hot` and an insert into `history`.
#
# Per window of WINDOW seconds: transactions per second (one transaction = one request),
# Postgres CPU µs and WAL bytes per request, the tables' size. The layouts run one after
# the other on fresh databases of one cluster, in the order LAYOUTS gives. Writes
# perf/runs/<date>-<host>/<commit>-<tag>/README.md.
#
#   MINUTES=10 scripts/bench-layouts.sh
#
# Settings: MINUTES (10), WINDOW (60), CLIENTS (16), WIDTH (120, seconds per partition),
# LAYOUTS ("partitions hot+history"), TAG (layouts).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
MINUTES=${MINUTES:-10}
WINDOW=${WINDOW:-60}
CLIENTS=${CLIENTS:-16}
WIDTH=${WIDTH:-120}
LAYOUTS=${LAYOUTS:-"partitions hot+history"}
tag=${TAG:-layouts}
need psql postgresql-client
command -v pgbench >/dev/null || compgen -G '/usr/lib/postgresql/*/bin/pgbench' >/dev/null || need pgbench postgresql-contrib
pgbench=$(command -v pgbench || ls /usr/lib/postgresql/*/bin/pgbench | head -1)

out=$(bench_out "$tag")
tmp=$(mktemp -d /tmp/bench-layouts.XXXXXX)
pg_dir=$(mktemp -d /tmp/bench-layouts-pg.XXXXXX)
pgb_pid=''
cleanup() {
  stop "$pgb_pid"
  scripts/dev-postgres.sh stop "$pg_dir" >/dev/null 2>&1 || true
  rm -rf "$tmp" "$pg_dir"
}
trap cleanup EXIT
pg_port=$(free_port)
base=$(scripts/dev-postgres.sh start "$pg_dir" "$pg_port"); base=${base%/clamp}
postmaster=$(head -1 "$pg_dir/postmaster.pid")

# The row as clamp writes it (the columns a two-step request sets).
cols="id uuid NOT NULL, workflow_name text NOT NULL, status text NOT NULL DEFAULT 'NEW',
  payload text NOT NULL, headers text NOT NULL DEFAULT '[]', current_step_id int NOT NULL DEFAULT 0,
  step_request text, lease_owner uuid, lease_until timestamptz NOT NULL DEFAULT '-infinity',
  created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now(),
  finished_at timestamptz, step_attempts int NOT NULL DEFAULT 0, workflow_version int"
steps="id bigserial, service_request_id uuid NOT NULL, step_id int NOT NULL, step_name text NOT NULL,
  status text NOT NULL, request text, response text, started_at timestamptz NOT NULL,
  finished_at timestamptz, time_taken_ms bigint, attempts int NOT NULL DEFAULT 1"
partition_fn="CREATE FUNCTION add_parts(tab text, key text, n int, width int) RETURNS void LANGUAGE plpgsql AS \$\$
DECLARE i int; lo timestamptz; BEGIN
  FOR i IN 0..n - 1 LOOP
    lo := now() - interval '1 minute' + i * width * interval '1 second';
    EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)', tab || '_' || i, tab,
      (lpad(to_hex(floor(extract(epoch FROM lo) * 1000)::bigint), 12, '0') || '70008000000000000000')::uuid,
      (lpad(to_hex(floor(extract(epoch FROM lo + width * interval '1 second') * 1000)::bigint), 12, '0') || '70008000000000000000')::uuid);
  END LOOP; END \$\$;"
id_expr="(lpad(to_hex(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') || '7' || substr(md5(random()::text), 1, 3) || '8' || substr(md5(random()::text), 1, 15))::uuid"
nparts=$(( MINUTES * 60 / WIDTH + 3 ))

setup_partitions() {
  cat <<SQL
$partition_fn
CREATE TABLE requests ($cols) PARTITION BY RANGE (id);
SELECT add_parts('requests', 'id', $nparts, $WIDTH);
CREATE UNIQUE INDEX requests_pkey ON requests (id);
CREATE INDEX requests_by_workflow ON requests (workflow_name, id);
CREATE INDEX requests_claim ON requests (lease_until) WHERE status IN ('NEW', 'RESUMED');
CREATE TABLE steps ($steps) PARTITION BY RANGE (service_request_id);
SELECT add_parts('steps', 'service_request_id', $nparts, $WIDTH);
CREATE UNIQUE INDEX steps_pkey ON steps (service_request_id, id);
DO \$\$ DECLARE r record; BEGIN FOR r IN SELECT c.relname FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid
  WHERE i.inhparent = 'requests'::regclass LOOP EXECUTE format('ALTER TABLE %I SET (fillfactor = 50)', r.relname); END LOOP; END \$\$;
SQL
}
script_partitions() {
  cat <<SQL
BEGIN;
SELECT $id_expr AS rid \\gset
INSERT INTO requests (id, workflow_name, payload, lease_owner, lease_until) VALUES ((:rid)::uuid, 'two', '{"n": 1}', '00000000-0000-0000-0000-000000000001', now() + interval '30 seconds');
COMMIT;
BEGIN;
UPDATE requests SET current_step_id = 2, step_request = '{"ok": true}', updated_at = now(), step_attempts = 0 WHERE id = (:rid)::uuid;
INSERT INTO steps (service_request_id, step_id, step_name, status, request, response, started_at, finished_at, time_taken_ms) VALUES ((:rid)::uuid, 1, 'a', 'COMPLETED', '', '{"ok": true}', now(), now(), 1);
COMMIT;
BEGIN;
UPDATE requests SET status = 'COMPLETED', current_step_id = 0, step_request = NULL, updated_at = now(), finished_at = now(), lease_owner = NULL WHERE id = (:rid)::uuid;
INSERT INTO steps (service_request_id, step_id, step_name, status, request, response, started_at, finished_at, time_taken_ms) VALUES ((:rid)::uuid, 2, 'b', 'COMPLETED', '', '{"ok": true}', now(), now(), 1);
COMMIT;
SQL
}
setup_hot() {
  cat <<SQL
$partition_fn
CREATE TABLE hot ($cols) WITH (fillfactor = 50);
ALTER TABLE hot ADD PRIMARY KEY (id);
CREATE INDEX hot_by_workflow ON hot (workflow_name, id);
CREATE INDEX hot_claim ON hot (lease_until) WHERE status IN ('NEW', 'RESUMED');
CREATE TABLE history ($cols) PARTITION BY RANGE (id);
SELECT add_parts('history', 'id', $nparts, $WIDTH);
CREATE UNIQUE INDEX history_pkey ON history (id);
CREATE INDEX history_by_workflow ON history (workflow_name, id);
CREATE TABLE steps ($steps) PARTITION BY RANGE (service_request_id);
SELECT add_parts('steps', 'service_request_id', $nparts, $WIDTH);
CREATE UNIQUE INDEX steps_pkey ON steps (service_request_id, id);
SQL
}
script_hot() {
  cat <<SQL
BEGIN;
SELECT $id_expr AS rid \\gset
INSERT INTO hot (id, workflow_name, payload, lease_owner, lease_until) VALUES ((:rid)::uuid, 'two', '{"n": 1}', '00000000-0000-0000-0000-000000000001', now() + interval '30 seconds');
COMMIT;
BEGIN;
UPDATE hot SET current_step_id = 2, step_request = '{"ok": true}', updated_at = now(), step_attempts = 0 WHERE id = (:rid)::uuid;
INSERT INTO steps (service_request_id, step_id, step_name, status, request, response, started_at, finished_at, time_taken_ms) VALUES ((:rid)::uuid, 1, 'a', 'COMPLETED', '', '{"ok": true}', now(), now(), 1);
COMMIT;
BEGIN;
WITH gone AS (DELETE FROM hot WHERE id = (:rid)::uuid RETURNING *)
INSERT INTO history SELECT id, workflow_name, 'COMPLETED', payload, headers, 0, NULL, NULL, lease_until, created_at, now(), now(), step_attempts, workflow_version FROM gone;
INSERT INTO steps (service_request_id, step_id, step_name, status, request, response, started_at, finished_at, time_taken_ms) VALUES ((:rid)::uuid, 2, 'b', 'COMPLETED', '', '{"ok": true}', now(), now(), 1);
COMMIT;
SQL
}

: > "$tmp/rows"
for layout in $LAYOUTS; do
  db=layout_$(echo "$layout" | tr -c 'a-z' '_')
  psql "$base/postgres" -qAt -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null
  case "$layout" in
    partitions) setup_partitions > "$tmp/setup.sql"; script_partitions > "$tmp/script.sql" ;;
    hot+history) setup_hot > "$tmp/setup.sql"; script_hot > "$tmp/script.sql" ;;
    *) echo "bench-layouts: unknown layout $layout" >&2; exit 2 ;;
  esac
  psql "$base/$db" -qAt -v ON_ERROR_STOP=1 -f "$tmp/setup.sql" >/dev/null
  size_sql="SELECT sum(pg_total_relation_size(relid)) FROM pg_stat_user_tables"
  "$pgbench" -n -M prepared -c "$CLIENTS" -j 2 -T $((MINUTES * 60)) -P "$WINDOW" -f "$tmp/script.sql" "$base/$db" > "$tmp/pgbench-$layout.txt" 2> "$tmp/progress-$layout.txt" &
  pgb_pid=$!
  start=$(date +%s)
  p0=$(tree_ticks "$postmaster"); w0=$(psql "$base/postgres" -qAt -c "SELECT pg_current_wal_lsn()")
  x0=$(psql "$base/$db" -qAt -c "SELECT xact_commit FROM pg_stat_database WHERE datname = '$db'")
  for m in $(seq 1 $((MINUTES * 60 / WINDOW))); do
    sleep $(( start + m * WINDOW - $(date +%s) ))
    p1=$(tree_ticks "$postmaster"); w1=$(psql "$base/postgres" -qAt -c "SELECT pg_current_wal_lsn()")
    x1=$(psql "$base/$db" -qAt -c "SELECT xact_commit FROM pg_stat_database WHERE datname = '$db'")
    wal=$(psql "$base/postgres" -qAt -c "SELECT pg_wal_lsn_diff('$w1', '$w0')::bigint")
    bytes=$(psql "$base/$db" -qAt -c "$size_sql")
    echo "$layout $m $((p1 - p0)) $wal $((x1 - x0)) $bytes" >> "$tmp/rows"
    echo "$layout minute $m: $(( (x1 - x0) / 3 )) requests, $(bm cpu-per $((p1 - p0)) $(( (x1 - x0) / 3 )) --fmt .1f) µs, $(( wal / ((x1 - x0) / 3 + 1) )) WAL B per request, $(( bytes / 1000000 )) MB"
    p0=$p1; w0=$w1; x0=$x1
  done
  wait "$pgb_pid" || true; pgb_pid=
done

export LY_ROWS="$tmp/rows" LY_OUT="$out" LY_MACHINE="$(machine_line)" LY_GIT="$(git_rev)" \
  LY_CMD="MINUTES=$MINUTES WINDOW=$WINDOW CLIENTS=$CLIENTS WIDTH=$WIDTH LAYOUTS=\"$LAYOUTS\" scripts/bench-layouts.sh" \
  LY_PG="$(pg_settings "$base")"
python3 - <<'PY'
import os, sys
sys.path.insert(0, 'scripts')
from benchmath import cpu_per, median, ratio
E = os.environ
rows = [l.split() for l in open(E['LY_ROWS'])]
by = {}
for layout, m, ticks, wal, xacts, size in rows:
    n = int(xacts) // 3  # three transactions a request
    by.setdefault(layout, []).append((int(m), n, cpu_per(int(ticks), n), ratio(int(wal), n), int(size) / 1e9))
lines = [f"# Two layouts of the request tables: {' and '.join(by)}", "",
         f"- machine: {E['LY_MACHINE']}; commit {E['LY_GIT']}",
         f"- command: `{E['LY_CMD']}`",
         f"- Postgres: `scripts/dev-postgres.sh start` (the README's), {E['LY_PG']}; pgbench -M prepared, a request = three transactions",
         "", "| layout | window | requests | Postgres µs per request | WAL B per request | tables' GB |", "|---|---|---|---|---|---|"]
for layout, ws in by.items():
    for m, n, cpu, wal, gb in ws:
        lines.append(f"| {layout} | {m} | {n:,} | {cpu:.1f} | {wal:,.0f} | {gb:.2f} |")
lines += ["", "| layout | requests/window (median) | µs per request (median) | WAL B per request (median) |", "|---|---|---|---|"]
for layout, ws in by.items():
    lines.append(f"| {layout} | {median(w[1] for w in ws):,.0f} | {median(w[2] for w in ws):.1f} | {median(w[3] for w in ws):,.0f} |")
open(f"{E['LY_OUT']}/README.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines[-(len(by) + 2):]))
PY
echo "bench-layouts: $out/README.md"
