#!/usr/bin/env bash
# Fire lateness of many schedules: SCHEDULES schedules (1,000) that each fire every second
# for DURATION seconds (30), on one server (the release build) and a throwaway Postgres with
# the settings of docs/configuration.md (scripts/dev-postgres.sh), each fire starting a one-step request
# against nginx (a fixed 200). Lateness is a fire's request's created_at (the server's
# clock when the pass made it, inside the transaction that commits it) minus its fire
# time, over the fires of the measured window; plus fires missing or doubled, and the
# server's CPU. Writes perf/runs/<date>-<host>/<commit>-<TAG>/<TAG>.md (TAG: schedule-lateness).
#
#   scripts/bench-schedules.sh
#   SCHEDULES=1000 DURATION=30 BIN=target/release/clamp scripts/bench-schedules.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
SCHEDULES=${SCHEDULES:-1000}
DURATION=${DURATION:-30}
BIN=${BIN:-target/release/clamp}
TAG=${TAG:-schedule-lateness}
[ -x "$BIN" ] || { echo "bench-schedules: $BIN is not built (cargo build --release)" >&2; exit 1; }
need nginx nginx
tmp=$(mktemp -d); chmod 755 "$tmp"
pgport=$(free_port); port=$(free_port); nport=$(free_port)
server_pid='' nginx_pid=''
cleanup() {
  for p in "$server_pid" "$nginx_pid"; do [ -z "$p" ] || kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  scripts/dev-postgres.sh stop "$tmp/pg" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
url=$(scripts/dev-postgres.sh start "$tmp/pg" "$pgport")
base=${url%/clamp}
mkdir -p "$tmp/nginx/logs"
cat > "$tmp/nginx/nginx.conf" <<NGX
worker_processes 1;
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx/logs/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $tmp/nginx/body; proxy_temp_path $tmp/nginx/proxy; fastcgi_temp_path $tmp/nginx/fcgi;
  uwsgi_temp_path $tmp/nginx/uwsgi; scgi_temp_path $tmp/nginx/scgi;
  server { listen 127.0.0.1:$nport; location / { default_type application/json; return 200 '{"ok":true}'; } }
}
NGX
nginx -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf" -e "$tmp/nginx/logs/error.log" -g 'daemon off;' &
nginx_pid=$!
server_cmd="$BIN --port $port --bind 127.0.0.1 --database-url $url"
LOG_LEVEL=warn $server_cmd > "$tmp/server.log" 2>&1 &
server_pid=$!
wait_up "$port"
curl -sf -o /dev/null -X POST "localhost:$port/workflow" -H 'content-type: application/json' \
  -d "{\"name\":\"tick\",\"steps\":[{\"name\":\"a\",\"mode\":\"HTTP\",\"val\":{\"method\":\"POST\",\"url\":\"http://127.0.0.1:$nport/a\"}}]}"
for i in $(seq 1 "$SCHEDULES"); do
  printf '{"name":"s%d","workflow":"tick","every":"1s","overlap":"allow","catchUp":"all"}\n' "$i"
done > "$tmp/defs"
# Created over a few connections at once (curl reads the definitions one per line).
split -n l/8 "$tmp/defs" "$tmp/part-"
for f in "$tmp"/part-*; do
  (while read -r d; do curl -sf -o /dev/null -X POST "localhost:$port/schedules" -H 'content-type: application/json' -d "$d" || echo fail; done < "$f") &
done
for j in $(jobs -p); do [ "$j" = "$server_pid" ] || [ "$j" = "$nginx_pid" ] || wait "$j"; done
n=$(psql "$url" -Atc "SELECT count(*) FROM schedules")
[ "$n" = "$SCHEDULES" ] || { echo "bench-schedules: $n of $SCHEDULES schedules created" >&2; exit 1; }
sleep 3
from=$(psql "$url" -Atc "SELECT date_trunc('second', now()) + interval '1 second'")
s0=$(proc_ticks "$server_pid"); t0=$(date +%s.%N)
sleep "$DURATION"
s1=$(proc_ticks "$server_pid"); t1=$(date +%s.%N)
upto=$(psql "$url" -Atc "SELECT date_trunc('second', now()) - interval '2 seconds'")
sleep 2
stats=$(psql "$url" -AtF ' ' -c "
  WITH f AS (
    SELECT f.schedule, f.fire_at, extract(epoch FROM r.created_at - f.fire_at) * 1000 AS late_ms
    FROM schedule_fires f JOIN service_requests r ON r.id = f.service_request_id
    WHERE f.fire_at >= '$from' AND f.fire_at <= '$upto')
  SELECT count(*),
         (SELECT count(*) FROM generate_series('$from'::timestamptz, '$upto'::timestamptz, interval '1 second')) * $SCHEDULES,
         round(percentile_cont(0.5) WITHIN GROUP (ORDER BY late_ms)::numeric, 1),
         round(percentile_cont(0.99) WITHIN GROUP (ORDER BY late_ms)::numeric, 1),
         round(max(late_ms)::numeric, 1),
         round(min(late_ms)::numeric, 1)
  FROM f")
read -r fired expected p50 p99 max min <<< "$stats"
dups=$(psql "$url" -Atc "SELECT count(*) FROM (SELECT service_request_id FROM schedule_fires GROUP BY 1 HAVING count(*) > 1) d")
done_=$(psql "$url" -Atc "SELECT count(*) FILTER (WHERE status = 'COMPLETED') FROM service_requests")
# ticks (1/100 s) per second of the window: the server's CPU in % of one core
cpu=$(bm ratio $((s1 - s0)) "$(bm elapsed "$t0" "$t1" --fmt .6f)" --fmt .0f)
out=$(bench_out "$TAG")
head=$(git_rev)
{
  echo "# Schedule fire lateness: $SCHEDULES schedules every second, $DURATION s"
  echo
  echo "- $(date -u +%FT%TZ), commit $head, $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(hostname)"
  echo "- server: \`$server_cmd\` (sha256 $(sha256sum "$BIN" | cut -c1-12)); Postgres: throwaway cluster of scripts/dev-postgres.sh ($(pg_settings "$base"))"
  echo "- each schedule: \`{\"workflow\":\"tick\",\"every\":\"1s\",\"overlap\":\"allow\",\"catchUp\":\"all\"}\`; workflow: one HTTP step to nginx (fixed 200)"
  echo "- window: fire times $from … $upto; lateness = the request's created_at − its fire time"
  echo
  echo "| fires expected | fires made | doubled | lateness p50 ms | p99 ms | max ms | min ms | server CPU % (of one core) | requests COMPLETED by the end |"
  echo "|---|---|---|---|---|---|---|---|---|"
  echo "| $expected | $fired | $dups | $p50 | $p99 | $max | $min | $cpu | $done_ |"
} > "$out/$TAG.md"
cat "$out/$TAG.md"
