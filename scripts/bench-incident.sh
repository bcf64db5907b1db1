#!/usr/bin/env bash
# An incident drill: a two-step workflow whose second step's downstream (nginx) answers
# 500 for a while, so that REQUESTS service requests fail at step 2 (a 500 is called once,
# as Clamp does); then the downstream is fixed (nginx reloaded to answer 200) and one bulk
# retry (`POST /serviceRequests/retry`) takes every failed request. The downstream's access
# log, with each call's Idempotency-Key, shows what was called: step 1 once per request,
# before the incident only; step 2 twice. Throwaway Postgres with the settings of docs/configuration.md.
# Writes perf/runs/<date>-<host>/<commit>-<tag>/<tag>.md.
#
#   scripts/bench-incident.sh                 # 2,000 requests
#   REQUESTS=5000 scripts/bench-incident.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
REQUESTS=${REQUESTS:-2000}
CONNS=${CONNS:-16}
bin=${BIN:-target/release}
[ -n "${BIN:-}" ] || cargo build --release --bin clamp -q
need nginx nginx
tag=${TAG:-incident}
out=$(bench_out "$tag")
pg_dir=/tmp/clamp-bench-incident-pg
base=$(scripts/dev-postgres.sh start $pg_dir 55496); base=${base%/clamp}
tmp=$(mktemp -d)
chmod 755 "$tmp"
port=18550
ngx=18551
db=clamp_bench_incident
nginx_conf() {  # nginx_conf <status of /b>
  cat > "$tmp/nginx.conf" <<NG
worker_processes 1; pid $tmp/nginx.pid; error_log $tmp/error.log;
events { worker_connections 1024; }
http {
  log_format keyed '\$uri \$http_idempotency_key \$status';
  access_log $tmp/access.log keyed;
  client_body_temp_path $tmp/body; proxy_temp_path $tmp/proxy; fastcgi_temp_path $tmp/fcgi;
  uwsgi_temp_path $tmp/uwsgi; scgi_temp_path $tmp/scgi;
  server { listen 127.0.0.1:$ngx;
    location /a { default_type application/json; return 200 '{"step":"a"}'; }
    location /b { default_type application/json; return $1 '{"step":"b"}'; } }
}
NG
}
nginx_conf 500
nginx -p "$tmp" -c "$tmp/nginx.conf"
fresh_db "$base" "$db"
server_pid=''
trap 'stop "$server_pid"; nginx -p "$tmp" -c "$tmp/nginx.conf" -s stop 2>/dev/null || true; scripts/dev-postgres.sh stop $pg_dir >/dev/null; rm -rf "$tmp"' EXIT
serve "$port" "$out/$tag-server.log" "$bin/clamp" --port $port --bind 127.0.0.1 --database-url "$base/$db"
curl -sf "localhost:$port/workflow" -d "{\"name\":\"claims\",\"description\":\"incident drill\",\"steps\":[
  {\"name\":\"a\",\"mode\":\"HTTP\",\"val\":{\"method\":\"POST\",\"url\":\"http://127.0.0.1:$ngx/a\"}},
  {\"name\":\"b\",\"mode\":\"HTTP\",\"val\":{\"method\":\"POST\",\"url\":\"http://127.0.0.1:$ngx/b\"}}]}" >/dev/null
t0=$(date +%s.%N)
seq 1 "$REQUESTS" | xargs -P "$CONNS" -I{} curl -sf -o /dev/null "localhost:$port/serviceRequest/claims" -d '{"claim":{}}'
created=$(metric "$port" 'create_service_request_handler_counter_total{status="2xx"}')
for _ in $(seq 1 600); do
  [ "$(( $(metric "$port" failed_service_request_handler_counter_total) + $(metric "$port" completed_service_request_handler_counter_total) ))" -ge "$created" ] && break
  sleep 0.1
done
failed_before=$(psql "$base/$db" -Atc "select count(*) from service_requests where status = 'FAILED'")
t1=$(date +%s.%N)
# The downstream is fixed.
nginx_conf 200
nginx -p "$tmp" -c "$tmp/nginx.conf" -s reload
sleep 1
calls_before=$(wc -l < "$tmp/access.log")
t2=$(date +%s.%N)
answer=$(curl -s "localhost:$port/serviceRequests/retry" -d '{"limit": 10000}')
for _ in $(seq 1 1200); do
  left=$(psql "$base/$db" -Atc "select count(*) from service_requests where status <> 'COMPLETED'")
  [ "$left" = 0 ] && break
  sleep 0.1
done
t3=$(date +%s.%N)
again=$(curl -s "localhost:$port/serviceRequests/retry" -d '{"limit": 10000}')
by_status=$(psql "$base/$db" -Atc "select string_agg(status || ' ' || n, ', ') from (select status, count(*) n from service_requests group by status order by status) s")
retries=$(psql "$base/$db" -Atc "select string_agg(retries || ': ' || n, ', ') from (select retries, count(*) n from service_requests group by retries order by retries) s")
counts=$(python3 - "$tmp/access.log" "$calls_before" <<'PY'
import collections, sys
lines = open(sys.argv[1]).read().split('\n')
before = int(sys.argv[2])
calls = collections.Counter()
after = collections.Counter()
status = collections.Counter()
for i, l in enumerate(x for x in lines if x.strip()):
    uri, key, st = l.split()
    calls[(uri, key)] += 1
    status[(uri, st)] += 1
    if i >= before:
        after[uri] += 1
a = [n for (u, k), n in calls.items() if u == '/a']
b = [n for (u, k), n in calls.items() if u == '/b']
print(f"step a: {len(a)} keys, at most {max(a)} call(s) per key, {after['/a']} calls after the fix; "
      f"step b: {len(b)} keys, {sum(b)} calls ({status[('/b', '500')]} answered 500, {status[('/b', '200')]} 200), "
      f"at most {max(b)} per key, {after['/b']} after the fix")
PY
)
elapsed() { bm elapsed "$1" "$2" --fmt .1f; }
{
  echo "# Incident drill: a downstream down, then one bulk retry"
  echo
  echo "- date: $(date -u +%FT%TZ), host $(hostname), nproc $(nproc), git $(git_rev)"
  echo "- server: \`$bin/clamp --port $port --bind 127.0.0.1 --database-url …/$db\` (defaults); Postgres: throwaway cluster from \`scripts/dev-postgres.sh\`: $(pg_settings "$base")"
  echo "- workflow \`claims\`: step a POST nginx /a (200), step b POST nginx /b (500 until the fix, then 200 after \`nginx -s reload\`); nginx logs each call's URI, Idempotency-Key and status"
  echo "- incident: $REQUESTS creates (\`curl\`, $CONNS at a time), each run until final: $failed_before FAILED in $(elapsed "$t0" "$t1") s"
  echo "- fix, then one \`POST /serviceRequests/retry\` with \`{\"limit\": 10000}\`: \`$answer\`; every request COMPLETED $(elapsed "$t2" "$t3") s after it"
  echo "- the same call once more: \`$again\`"
  echo "- requests by status at the end: $by_status; by retries: $retries"
  echo "- downstream calls: $counts"
} | tee "$out/$tag.md"
