#!/usr/bin/env bash
# micro2.sh [ROUNDS=5] [SECS=10] [ROWS=16]: the request table's index sets and its row's
# width priced with pgbench, on a throwaway cluster of the README's Postgres
# (scripts/dev-postgres.sh). Five plain (not partitioned) copies of service_requests as
# src/store/schema.sql makes it, fillfactor 50:
#   t_all     every index of the table
#   t_noexpr  the claim order (an expression index) replaced by fc96a5f's claim index,
#             (lease_until) WHERE status IN ('NEW', 'IN_PROGRESS', 'RESUMED')
#   t_fewer   without the deadlines, event-wait and fan-out held indexes
#   t_old     the indexes fc96a5f had (t_noexpr without those three and the labels')
#   t_narrow  t_old without the ten columns added since fc96a5f (fan_index to notify):
#             fc96a5f's row and indexes
# Per transaction, as a plain two-step request's rows are written in batches: a ROWS-row
# insert (leased to an instance, as the create's insert writes them; 16 is the create's
# batch under load), the rows' update between steps (HOT), and their finishing update.
# `pgbench -M prepared -c 1`, synchronous_commit off (the price of the indexes, not of
# the flush), the tables alternating round by round. Prints transactions per second per
# table and round.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
. scripts/bench-lib.sh
ROUNDS=${ROUNDS:-5} SECS=${SECS:-10} ROWS=${ROWS:-16}
pgbench=$(command -v pgbench || ls /usr/lib/postgresql/*/bin/pgbench | head -1)
tmp=$(mktemp -d /tmp/micro.XXXXXX); pg_dir=$(mktemp -d /tmp/micro-pg.XXXXXX)
trap 'scripts/dev-postgres.sh stop "$pg_dir" >/dev/null 2>&1 || true; rm -rf "$tmp" "$pg_dir"' EXIT
port=$(free_port)
base=$(scripts/dev-postgres.sh start "$pg_dir" "$port"); base=${base%/clamp}
db="$base/micro"
psql "$base/postgres" -qAtc "CREATE DATABASE micro" >/dev/null
# The table and its indexes as schema.sql has them, on a plain table named $1.
table() {
  sed -n '/^CREATE TABLE service_requests (/,/^CREATE INDEX service_requests_untold/p' src/store/schema.sql |
    sed "s/ PARTITION BY RANGE (id)//; s/ON ONLY public.service_requests/ON public.$1/;
         s/^CREATE TABLE service_requests/CREATE TABLE $1/; /^ALTER TABLE service_requests/d;
         s/CREATE \(UNIQUE \)\{0,1\}INDEX service_requests_/CREATE \1INDEX $1_/"
}
drop_claim_order() {  # the claim order's definition spans lines up to its WHERE
  awk -v n="$1_claim_order" 'index($0, "INDEX " n " ") {skip = 1} skip && /WHERE/ {skip = 0; next} !skip'
}
claimable="(lease_until) WHERE status IN ('NEW', 'IN_PROGRESS', 'RESUMED');"
{
  table t_all
  table t_noexpr | drop_claim_order t_noexpr; echo "CREATE INDEX t_noexpr_claimable ON t_noexpr $claimable"
  table t_fewer | grep -v 't_fewer_deadlines\|t_fewer_event_waits\|t_fewer_fan_held'
  table t_old | drop_claim_order t_old | grep -v 't_old_deadlines\|t_old_event_waits\|t_old_fan_held\|t_old_labels'
  echo "CREATE INDEX t_old_claimable ON t_old $claimable"
  table t_narrow | drop_claim_order t_narrow |
    grep -v 't_narrow_deadlines\|t_narrow_event_waits\|t_narrow_fan_held\|t_narrow_labels' |
    grep -v '^    \(fan_index\|wait_event\|wait_key\|wait_next\|deadline\|concurrency_key\|admitted_at\|priority\|labels\|notify\) ' |
    sed 's/^\(    start_at timestamp with time zone\),$/\1/'
  echo "CREATE INDEX t_narrow_claimable ON t_narrow $claimable"
  for t in t_all t_noexpr t_fewer t_old t_narrow; do echo "ALTER TABLE $t SET (fillfactor = 50);"; done
  echo "CREATE SEQUENCE ids;"
} | psql "$db" -qAt -v ON_ERROR_STOP=1 >/dev/null
ids="ARRAY(SELECT lpad(to_hex(:base + g), 32, '0')::uuid FROM generate_series(0, $((ROWS - 1))) g)"
for t in t_all t_noexpr t_fewer t_old t_narrow; do
  psql "$db" -qAtc "SELECT '$t', count(*) FROM pg_indexes WHERE tablename = '$t'" | tr '|' ' '
  cat > "$tmp/$t.sql" <<SQL
SELECT nextval('ids') * $ROWS AS base \gset
INSERT INTO $t (id, workflow_name, payload, headers, lease_owner, lease_until, created_at) SELECT lpad(to_hex(:base + g), 32, '0')::uuid, 'two', '{"a":1,"b":"some text here"}', '[]', '11111111-1111-1111-1111-111111111111', now() + interval '30 s', now() FROM generate_series(0, $((ROWS - 1))) g;
UPDATE $t SET current_step_id = 1, step_request = 'x', step_attempts = 0, updated_at = now() WHERE id = ANY($ids);
UPDATE $t SET status = 'COMPLETED', lease_owner = NULL, lease_until = '-infinity', finished_at = now(), updated_at = now(), current_step_id = 2 WHERE id = ANY($ids);
SQL
done
# One unmeasured round first (the cluster's first writes).
for t in t_all t_noexpr t_fewer t_old t_narrow; do
  PGOPTIONS="-c synchronous_commit=off" "$pgbench" -n -M prepared -c 1 -T 3 -f "$tmp/$t.sql" "$db" >/dev/null 2>&1
done
for r in $(seq "$ROUNDS"); do
  for t in t_all t_noexpr t_fewer t_old t_narrow; do
    tps=$(PGOPTIONS="-c synchronous_commit=off" "$pgbench" -n -M prepared -c 1 -T "$SECS" -f "$tmp/$t.sql" "$db" 2>&1 | awk '/^tps/ {print $3}')
    echo "round $r $t $tps"
  done
done
