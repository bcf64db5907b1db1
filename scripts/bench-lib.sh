# shellcheck shell=bash
# Helpers the bench-*.sh scripts share (sourced, not run).

# proc_ticks PID: cumulative CPU ticks (1/100 s) of one process (0 once it is gone).
proc_ticks() { awk '{print $14+$15}' "/proc/$1/stat" 2>/dev/null || echo 0; }

# sum_ticks NAME: cumulative CPU ticks of every process with that exact name.
sum_ticks() {
  local p t=0
  for p in $(pgrep -x "$1"); do t=$((t + $(proc_ticks "$p"))); done
  echo "$t"
}

# wait_up PORT...: waits (up to 10 s each) until GET /health answers on each port.
wait_up() {
  local port
  for port; do
    for _ in $(seq 1 100); do curl -sf "localhost:$port/health" >/dev/null && break; sleep 0.1; done
  done
}

# pg_settings BASE_URL: the Postgres settings a record states, as name=value pairs.
pg_settings() {
  psql "$1/postgres" -Atc "select string_agg(name || '=' || current_setting(name), ', ' order by name) from pg_settings where name in ('max_wal_size', 'checkpoint_timeout', 'shared_buffers', 'synchronous_commit', 'fsync')"
}

# load_rows DB_URL ROWS: ROWS service requests spread over the last 24 hours across the
# workflows claims, refunds, payouts, audits (and rare, one in a thousand): 90% COMPLETED,
# 5% FAILED, 3% CANCELLED, 2% NEW, written straight into the table, then VACUUM ANALYZE.
load_rows() {
  local ROWS=$2
  # UUIDv7 ids from each row's creation millisecond (random low bits), as the server makes them.
  psql "$1" -qAt <<SQL
INSERT INTO service_requests (id, workflow_name, status, payload, created_at, updated_at, finished_at, current_step_id)
SELECT (lpad(to_hex((extract(epoch FROM t) * 1000)::bigint), 12, '0') || '7' ||
        substr(md5(g::text), 1, 3) || '8' || substr(md5(g::text), 4, 15))::uuid,
       CASE WHEN g % 1000 = 7 THEN 'rare' ELSE (ARRAY['claims', 'refunds', 'payouts', 'audits'])[1 + g % 4] END,
       CASE WHEN g % 100 < 90 THEN 'COMPLETED' WHEN g % 100 < 95 THEN 'FAILED'
            WHEN g % 100 < 98 THEN 'CANCELLED' ELSE 'NEW' END,
       '{"claimDetails":{"claimType":"MOTOR","amount":1250.75}}', t, t,
       CASE WHEN g % 100 < 98 THEN t END, 0
FROM (SELECT g, now() - interval '24 hours' + (g * (interval '24 hours' / $ROWS)) AS t
      FROM generate_series(1, $ROWS) g) s;
VACUUM ANALYZE service_requests;
SQL
}

# server_on_large_table BIN PG_DIR BASE DB PORT TAG ROWS: an API-only server (BIN/clamp) on
# a fresh database DB of the throwaway cluster at BASE (from PG_DIR), both stopped on exit
# (sets server_pid), with the workflows claims, refunds, payouts, audits and rare, and
# ROWS requests written by load_rows. The server's log: /tmp/TAG-server.log.
server_on_large_table() {
  local bin=$1 pg_dir=$2 base=$3 db=$4 port=$5 tag=$6 rows=$7 wf
  psql "$base/postgres" -qAtc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1
  "$bin/clamp" --port "$port" --bind 127.0.0.1 --database-url "$base/$db" --max-running 0 > "/tmp/$tag-server.log" 2>&1 &
  server_pid=$!
  # shellcheck disable=SC2064  # the values now: the trap runs after this function returns
  trap "kill $server_pid 2>/dev/null || true; scripts/dev-postgres.sh stop $pg_dir >/dev/null" EXIT
  wait_up "$port"
  for wf in claims refunds payouts audits rare; do
    curl -sf "localhost:$port/workflow" -d "{\"name\":\"$wf\",\"description\":\"$tag\",\"steps\":[{\"name\":\"a\",\"mode\":\"HTTP\",\"val\":{\"method\":\"POST\",\"url\":\"http://127.0.0.1:9/a\"}}]}" >/dev/null
  done
  load_rows "$base/$db" "$rows"
}

# warm_memory: once per boot, writes and deletes a file about as large as the memory
# available, so that the page cache a benchmark grows into (new table pages, new WAL
# segments) is memory this machine has touched before. On the virtual machines here the
# first write into never-touched memory costs several times a later one (dd of 1 GiB into
# a new file: 1.6-2.6 s on a fresh machine, 0.5-0.9 s once its memory had been used), and
# whichever run of a comparison first reached new memory looked slower for it. WARM=0
# skips it; it is skipped too where the disk has no room for the file.
warm_memory() {
  [ "${WARM:-1}" = 1 ] || return 0
  local marker=/tmp/.clamp-bench-warm boot avail_mb free_mb
  boot=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo unknown)
  [ "$(cat "$marker" 2>/dev/null)" = "$boot" ] && return 0
  avail_mb=$(awk '/^MemAvailable:/ {print int($2 / 1024)}' /proc/meminfo)
  free_mb=$(df -Pm /tmp | awk 'NR == 2 {print $4}')
  local size_mb=$((avail_mb - 1024))
  if [ "$size_mb" -gt 0 ] && [ "$free_mb" -gt $((size_mb + 4096)) ]; then
    echo "bench: touching ${size_mb} MB of memory once (page cache), about a minute" >&2
    dd if=/dev/zero of=/tmp/.clamp-bench-warm.fill bs=1M count="$size_mb" status=none || true
    rm -f /tmp/.clamp-bench-warm.fill
  fi
  echo "$boot" > "$marker"
}
warm_memory
