#!/usr/bin/env bash
# What the product's table costs Postgres per create: the bare reference server
# (perf/src/bin/clamp-reference.rs) run four times side by side, each on its own database
# of one throwaway Postgres with the settings of docs/configuration.md, its table growing one feature of
# the product's `service_requests` at a time (its columns with their defaults and
# fillfactor, the by-workflow index, the claimable index), then the same table with
# fillfactor 50 (migration 7), or with VARIANT=c the by-workflow index keyed in the "C"
# collation (compared as bytes) instead of the database's. With VARIANT=key: the product's table of
# migration 16 against the same with the by-workflow index keyed by the id's millisecond
# (`substr(uuid_send(id), 1, 6)`: equal keys share one posting list), and with none. With VARIANT=layout or
# VARIANT=fill: every column and index of the product's table (migration 16) against a primary key that
# leads with a workflow key, and against each fillfactor (see the variant's comment). `wrk -t1 -c128` creates against
# each in rotating order per round (rotation of scripts/bench-lib.sh); CPU per request of
# the server and of Postgres is sampled inside each run. Writes
# perf/runs/<date>-<host>/<commit>-<tag>/<tag>.md.
#
#   scripts/bench-reference-costs.sh            # 3 rounds of 8 s
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
CONNS=${CONNS:-128}
DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-3}
bin=${BIN:-target/release}
command -v wrk >/dev/null || { echo "bench-reference-costs: wrk is required (apt-get install wrk)" >&2; exit 1; }
[ -n "${BIN:-}" ] || cargo build --release --workspace --bins -q
tag=${TAG:-reference-costs}
out=$(bench_out "$tag")
pg_dir=/tmp/clamp-bench-refcost-pg
base=$(scripts/dev-postgres.sh start $pg_dir 55498); base=${base%/clamp}
t=reference_requests
columns="ALTER TABLE $t ADD COLUMN workflow_name text NOT NULL DEFAULT 'bench', \
ADD COLUMN status text NOT NULL DEFAULT 'NEW', ADD COLUMN headers text NOT NULL DEFAULT '{}', \
ADD COLUMN current_step_id integer NOT NULL DEFAULT 0, ADD COLUMN step_request text, \
ADD COLUMN failed_step_id integer, ADD COLUMN lease_owner uuid, \
ADD COLUMN lease_until timestamptz NOT NULL DEFAULT '-infinity', ADD COLUMN reason text, \
ADD COLUMN created_at timestamptz NOT NULL DEFAULT now(), \
ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now(), ADD COLUMN finished_at timestamptz, \
ADD COLUMN step_attempts integer NOT NULL DEFAULT 0, ADD COLUMN last_error text; \
ALTER TABLE $t SET (fillfactor = 80);"
by_workflow="CREATE INDEX ON $t (workflow_name, id);"
by_workflow_c="CREATE INDEX ON $t (workflow_name COLLATE \"C\", id);"
claimable="CREATE INDEX ON $t (lease_until) WHERE status IN ('NEW', 'IN_PROGRESS', 'RESUMED');"
if [ "${VARIANT:-}" = c ]; then
  last_name="+ columns, by-workflow index in the C collation, claimable index"
  last_ddl="$columns $by_workflow_c $claimable"
else
  last_name="the same table with fillfactor 50 (the product's table)"
  last_ddl="$columns $by_workflow $claimable ALTER TABLE $t SET (fillfactor = 50);"
fi
names=("primary key only" "+ the product's columns" "+ by-workflow index" "+ claimable index (the table of 018c7b2)"
  "$last_name")
ddls=("" "$columns" "$columns $by_workflow" "$columns $by_workflow $claimable" "$last_ddl")
if [ "${VARIANT:-}" = key ]; then
  # The product's table of migration 16 against the by-workflow index keyed by the
  # millisecond of the id (equal keys share one entry), and against none at all.
  table="$columns $claimable ALTER TABLE $t SET (fillfactor = 50); ALTER INDEX ${t}_pkey SET (fillfactor = 50);"
  by_ms="CREATE INDEX ON $t (workflow_name, substr(uuid_send(id), 1, 6));"
  names=("primary key only" "the product's table of migration 16" "the same, by-workflow index keyed by the id's millisecond"
    "the same, no by-workflow index" "by the millisecond, primary key at the default fillfactor")
  ddls=("" "$table CREATE INDEX ${t}_wf ON $t (workflow_name, id); ALTER INDEX ${t}_wf SET (fillfactor = 50);"
    "$table $by_ms" "$table" "$columns $claimable ALTER TABLE $t SET (fillfactor = 50); $by_ms")
fi
if [ "${VARIANT:-}" = layout ] || [ "${VARIANT:-}" = fill ]; then
  # Today's table (migration 16: every column and index of the product's) against the
  # layouts that would make it cheaper. VARIANT=layout: the primary key leading with a
  # small workflow key (so that it serves the listing by workflow, and the by-workflow
  # index goes), and the default fillfactor (no room kept for HOT updates). VARIANT=fill:
  # which fillfactor costs what (the table's, the keys'), and the partial indexes that no
  # create enters.
  partial="CREATE INDEX ON $t (parent_id, id) WHERE parent_id IS NOT NULL; \
CREATE INDEX ON $t (id) WHERE status IN ('FAILED', 'CANCELLED'); \
CREATE INDEX ON $t (workflow_name, id) WHERE status IN ('FAILED', 'CANCELLED'); \
CREATE INDEX ON $t (rerun_of, id) WHERE rerun_of IS NOT NULL; \
CREATE INDEX ON $t (id) WHERE parent_id IS NOT NULL AND NOT parent_told AND status IN ('COMPLETED', 'FAILED', 'CANCELLED');"
  more_columns="$columns ALTER TABLE $t ADD COLUMN retries integer NOT NULL DEFAULT 0, \
ADD COLUMN rerun_of uuid, ADD COLUMN workflow_version integer, ADD COLUMN parent_id uuid, \
ADD COLUMN parent_step_id integer, ADD COLUMN parent_told boolean, ADD COLUMN start_at timestamptz; $claimable"
  all_columns="$more_columns $partial"
  wf_key="ALTER TABLE $t ADD COLUMN wf_key smallint NOT NULL DEFAULT 1; \
ALTER TABLE $t DROP CONSTRAINT ${t}_pkey, ADD PRIMARY KEY (wf_key, id);"
  by_wf="CREATE INDEX ${t}_by_workflow ON $t (workflow_name, id);"
  half="ALTER TABLE $t SET (fillfactor = 50);"
  half_keys="ALTER INDEX ${t}_pkey SET (fillfactor = 50); ALTER INDEX ${t}_by_workflow SET (fillfactor = 50);"
  full="ALTER TABLE $t SET (fillfactor = 100);"
  if [ "${VARIANT:-}" = layout ]; then
    names=("primary key only" "the product's table of migration 16"
      "the same, primary key (workflow key, id) instead of the by-workflow index"
      "the same at the default fillfactor (table and key)"
      "migration 16's indexes, the default fillfactor (table and keys)")
    ddls=("" "$all_columns $by_wf $half $half_keys" "$all_columns $wf_key $half"
      "$all_columns $wf_key $full" "$all_columns $by_wf $full")
  else
    names=("primary key only" "the product's table of migration 16"
      "the same without the partial indexes" "the same, the table at fillfactor 100"
      "the same, the keys at the default fillfactor" "the same, the table at 100 and the keys at the default")
    ddls=("" "$all_columns $by_wf $half $half_keys" "$more_columns $by_wf $half $half_keys"
      "$all_columns $by_wf $full $half_keys" "$all_columns $by_wf $half" "$all_columns $by_wf $full")
  fi
fi
flags=("" "" "" "" "" "")
n=${#names[@]}
pids=()
trap 'kill ${pids[*]} 2>/dev/null || true; scripts/dev-postgres.sh stop $pg_dir >/dev/null' EXIT
for i in $(seq 0 $((n - 1))); do
  fresh_db "$base" "clamp_refcost_$i"
  "$bin/clamp-reference" --port $((18520 + i)) --database-url "$base/clamp_refcost_$i" --ddl "${ddls[$i]}" ${flags[$i]} \
    > "/tmp/$tag-$i.log" 2>&1 &
  pids+=($!)
done
wait_up $(seq 18520 $((18520 + n - 1)))
pg_settings=$(pg_settings "$base")
ticks() { echo "$(proc_ticks "$1") $(sum_ticks postgres)"; }
run() {  # run <variant>: prints rate, server and Postgres CPU µs per request
  local i=$1 f a b
  f=$(mktemp)
  wrk -t1 -c"$CONNS" -d"${DURATION}s" -s perf/wrk/create.lua "http://127.0.0.1:$((18520 + i))" -- bench > "$f" 2>&1 &
  local w=$!
  sleep 1; a=$(ticks "${pids[$i]}"); sleep $((DURATION - 2)); b=$(ticks "${pids[$i]}")
  wait $w
  python3 - "$f" "$a" "$b" $((DURATION - 2)) <<'EOF'
import sys
sys.path.insert(0, 'scripts')
from benchmath import cpu_per, wrk
rate = wrk(open(sys.argv[1]).read())[0]
(s0, p0), (s1, p1) = map(int, sys.argv[2].split()), map(int, sys.argv[3].split())
n = int(sys.argv[4]) * rate  # requests in the sampled window
print(round(rate), f'{cpu_per(s1 - s0, n):.1f}', f'{cpu_per(p1 - p0, n):.1f}')
EOF
  rm -f "$f"
}
results=()
for round in $(seq 1 "$ROUNDS"); do
  for i in $(rotation "$round" "$n"); do
    read -r r s p < <(run "$i")
    results+=("$i $r $s $p")
    echo "round $round: ${names[$i]}: $r/s, $s µs server, $p µs Postgres"
  done
done
{
  echo "# What the product's table costs Postgres per create (the reference server, growing)"
  echo
  echo "- $(machine_line)"
  echo "- git: $(git_rev)"
  echo "- servers: \`$bin/clamp-reference --port 1852<i> --database-url …/clamp_refcost_<i> --ddl <variant>\` (see scripts/bench-reference-costs.sh for each variant's SQL)"
  echo "- load: \`wrk -t1 -c$CONNS -d${DURATION}s -s perf/wrk/create.lua http://… -- bench\`, the variants in rotating order per round"
  echo "- Postgres: throwaway cluster from \`scripts/dev-postgres.sh\` (the settings of docs/configuration.md): $pg_settings"
  echo
  echo "| table | creates/s (median) | ÷ primary key only (median of rounds) | server µs/request | Postgres µs/request | Postgres µs added by this step |"
  echo "|---|---|---|---|---|---|"
  printf '%s\n' "${results[@]}" | python3 -c "
import sys
sys.path.insert(0, 'scripts')
from benchmath import median, ratio as div
names = '''$(printf '%s\n' "${names[@]}")'''.splitlines()
rows = [l.split() for l in sys.stdin if l.strip()]
base = [r for r in rows if int(r[0]) == 0]
prev = None
for i, name in enumerate(names):
    mine = [r for r in rows if int(r[0]) == i]
    rate = median(int(r[1]) for r in mine)
    rate = int(rate) if rate == int(rate) else rate
    # Each round's variant against the same round's primary-key-only run.
    ratio = median(div(m[1], b[1]) for m, b in zip(mine, base))
    s = median(float(r[2]) for r in mine)
    p = median(float(r[3]) for r in mine)
    if i == 0:
        added = ''
    elif i == len(names) - 1:
        added = f'{p - prev:+.1f} against the row above'
    else:
        added = f'{p - prev:+.1f}'
    print(f'| {name} | {rate:,} | {ratio:.2f} | {s:.1f} | {p:.1f} | {added} |')
    if i == 0:
        p0 = p
    prev = p"
} | tee "$out/$tag.md"
