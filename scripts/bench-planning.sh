#!/usr/bin/env bash
# What Postgres spends planning the server's statements, two server binaries side by side:
# per round and binary (the order alternating from round to round), a fresh database of
# one throwaway Postgres with the settings of docs/configuration.md, pg_stat_statements
# loaded with `track_planning` on, a fresh server, the two-step HTTP workflow against
# nginx (a fixed 200 on 127.0.0.1) and `wrk -t1 -c64` creates for DURATION seconds from
# the server's start. Per binary, the statements' plans and calls, planning and execution
# milliseconds (of the last round, by planning time), and the planning time per created
# request of every round: a statement planned on most of its runs shows as plans close to
# calls. Writes perf/runs/<date>-<host>/<commit>-<tag>/<tag>.md.
#
#   A=/tmp/bins/clamp-old B=target/release/clamp scripts/bench-planning.sh
#
# Settings: A, B (server binaries), ROUNDS (2), DURATION (15, seconds of wrk), TOP (15,
# statements listed per binary), SERVER_FLAGS (both binaries), CONCURRENCY (a
# `concurrency` object for the workflow, e.g. '{"key":"payload.k","limit":4}') and KEYS
# (0; N: each create's payload carries "k", one of N keys in turn), TAG (planning).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
: "${A:?A=path of the first server binary}" "${B:?B=path of the second server binary}"
ROUNDS=${ROUNDS:-2}
DURATION=${DURATION:-15}
TOP=${TOP:-15}
tag=${TAG:-planning}
for which in A B; do
  [ -x "${!which}" ] || { echo "bench-planning: $which=${!which} is not an executable" >&2; exit 1; }
done
need wrk wrk
need nginx nginx
need psql postgresql-client

out=$(bench_out "$tag")
tmp=$(mktemp -d /tmp/bench-planning.XXXXXX)
chmod 755 "$tmp"  # nginx's workers run as nobody
pg_dir=$(mktemp -d /tmp/bench-planning-pg.XXXXXX)
server_pid='' nginx_pid=''
cleanup() {
  stop "$server_pid" "$nginx_pid"
  scripts/dev-postgres.sh stop "$pg_dir" >/dev/null 2>&1 || true
  rm -rf "$tmp" "$pg_dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

pg_port=$(free_port)
base=$(PG_EXTRA_CONF="shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track_planning = on" scripts/dev-postgres.sh start "$pg_dir" "$pg_port")
base=${base%/clamp}
sql() { PGOPTIONS='-c client_min_messages=warning' psql "$base/${2:-postgres}" -qAtX -v ON_ERROR_STOP=1 -c "$1"; }
sql "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null
nginx_port=$(free_port)
start_nginx "$tmp/nginx" "server { listen 127.0.0.1:$nginx_port; location / { default_type application/json; return 200 '{\"ok\":true}'; } }"
for _ in $(seq 1 50); do curl -sf -o /dev/null -X POST -d x "http://127.0.0.1:$nginx_port/a" && break; sleep 0.1; done
conc=
[ -z "${CONCURRENCY:-}" ] || conc=",\"concurrency\":$CONCURRENCY"
workflow="{\"name\":\"two\",\"description\":\"bench\"$conc,\"steps\":[{\"name\":\"a\",\"mode\":\"HTTP\",\"val\":{\"method\":\"POST\",\"url\":\"http://127.0.0.1:$nginx_port/a\"}},{\"name\":\"b\",\"mode\":\"HTTP\",\"val\":{\"method\":\"POST\",\"url\":\"http://127.0.0.1:$nginx_port/b\"}}]}"
export BENCH_KEYS=${KEYS:-0} BENCH_TOKEN=
port=$(free_port)
wrk_cmd="wrk -t1 -c64 -d${DURATION}s -s perf/wrk/create.lua http://127.0.0.1:$port -- two"
# The statements of database $1, by planning time: calls, plans, planning and execution ms.
statements() {
  sql "SELECT calls, plans, round(total_plan_time::numeric, 1), round(total_exec_time::numeric, 1),
         replace(left(regexp_replace(query, '\s+', ' ', 'g'), 90), '|', '\|')
       FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = '$1')
         AND query NOT LIKE '%pg_stat_statements%'
       ORDER BY total_plan_time DESC LIMIT $TOP" | awk -F'|' '{printf "| %s | %s | %s | %s | `%s` |\n", $1, $2, $3, $4, $5}'
}
plan_ms() {
  sql "SELECT round(coalesce(sum(total_plan_time), 0)::numeric, 1) FROM pg_stat_statements
       WHERE dbid = (SELECT oid FROM pg_database WHERE datname = '$1')"
}

: > "$tmp/rows"
for round in $(seq 1 "$ROUNDS"); do
  for which in $(ab_order "$round"); do
    db=clamp_planning_${round}_${which,,}
    sql "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
    # shellcheck disable=SC2086
    serve "$port" "$tmp/server-$round-$which.log" "${!which}" --port "$port" --bind 127.0.0.1 \
      --database-url "$base/$db" ${SERVER_FLAGS:-}
    curl -sf -o /dev/null -X POST -H 'Content-Type: application/json' -d "$workflow" "http://127.0.0.1:$port/workflow"
    sql "SELECT pg_stat_statements_reset()" >/dev/null
    $wrk_cmd > "$tmp/wrk-$round-$which.txt"
    created=$(awk '/requests in/ {print $1}' "$tmp/wrk-$round-$which.txt")
    ms=$(plan_ms "$db")
    statements "$db" > "$tmp/statements-$which.md"
    stop "$server_pid"
    server_pid=
    echo "$round $which $created $ms" >> "$tmp/rows"
  done
done

{
  echo "# What Postgres spends planning the server's statements, A against B"
  echo
  echo "- $(machine_line)"
  echo "- A: \`${A}\` (sha256 $(sha256sum "$A" | cut -c1-12)); B: \`${B}\` (sha256 $(sha256sum "$B" | cut -c1-12))"
  echo "- Postgres: throwaway cluster, \`scripts/dev-postgres.sh\` (the settings of docs/configuration.md) with pg_stat_statements and \`pg_stat_statements.track_planning = on\`: $(pg_settings "$base")"
  echo "- per round and binary: a fresh database and server, the two-step workflow${CONCURRENCY:+ with \`\"concurrency\":$CONCURRENCY\`} against nginx's fixed 200, the statistics reset, then \`${KEYS:+BENCH_KEYS=$KEYS }$wrk_cmd\` from the server's first seconds on (what a fresh server plans is in it)"
  echo "- rounds: $ROUNDS, A then B in odd rounds, B then A in even ones"
  echo
  echo "| round | binary | created | planning ms | planning µs per created request |"
  echo "|---|---|---|---|---|"
  while read -r r w c m; do
    echo "| $r | $w | $c | $m | $(bm --fmt .1f ratio "$(awk -v m="$m" 'BEGIN {print m * 1000}')" "$c") |"
  done < "$tmp/rows"
  for which in A B; do
    echo
    echo "Statements of $which (last round), by planning time:"
    echo
    echo "| calls | plans | planning ms | execution ms | statement |"
    echo "|---|---|---|---|---|"
    cat "$tmp/statements-$which.md"
  done
} > "$out/$tag.md"
echo "$out/$tag.md"
