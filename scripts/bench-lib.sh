# shellcheck shell=bash
# Helpers every scripts/bench*.sh shares (sourced, not run, from the repository's root):
# where a record goes, the machine it ran on, Postgres databases and settings, starting and
# stopping a server, CPU ticks, the order of A/B rounds, and `bm`, the arithmetic of
# scripts/benchmath.py. Sourcing it also warms the page cache once per boot (warm_memory).

# bm SUBCOMMAND ARGS...: scripts/benchmath.py (median, ratio, cpu-per, cores, rate, elapsed,
# p90, json, wrk; --fmt SPEC), the one place the scripts do their arithmetic.
bm() { python3 scripts/benchmath.py "$@"; }

# git_rev: the short commit of the working tree (none outside git).
git_rev() { git rev-parse --short=7 HEAD 2>/dev/null || echo none; }

# bench_out WHAT: the folder a run's record goes to, perf/runs/<date>-<host>/<commit>-<WHAT>/
# (made if missing), as perf/README.md describes.
bench_out() {
  local d
  d=perf/runs/$(date -u +%Y-%m-%d)-$(hostname)/$(git_rev)-$1
  mkdir -p "$d"
  echo "$d"
}

# machine_line: date, host, cores and CPU model, as a record's first line states them.
machine_line() {
  echo "date: $(date -u +%FT%TZ), host $(hostname), nproc $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
}

# free_port: a TCP port free on 127.0.0.1 now.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# need COMMAND PACKAGE: installs PACKAGE from Debian's packages if COMMAND is missing.
bench_apt_updated=
need() {
  command -v "$1" >/dev/null && return 0
  if [ -z "$bench_apt_updated" ]; then apt-get update -qq; bench_apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
  command -v "$1" >/dev/null || { echo "bench: $1 is still missing after installing $2" >&2; exit 1; }
}

# fresh_db BASE_URL DB: drops database DB of the cluster at BASE_URL (the server makes it anew).
fresh_db() { psql "$1/postgres" -qAtc "DROP DATABASE IF EXISTS $2 WITH (FORCE)" >/dev/null 2>&1; }

# serve PORT LOG COMMAND...: starts a server in the background, its output in LOG, sets
# server_pid and waits until GET /health answers on PORT; exits showing LOG's tail if not.
serve() {
  local port=$1 log=$2
  shift 2
  "$@" > "$log" 2>&1 &
  server_pid=$!
  wait_up "$port"
  curl -sf -o /dev/null "localhost:$port/health" \
    || { echo "bench: the server on port $port did not come up; $log:" >&2; tail -20 "$log" >&2; exit 1; }
}

# stop PID...: stops the processes (TERM) and waits for them; empty arguments are skipped.
stop() {
  local p
  for p; do [ -z "$p" ] || kill "$p" 2>/dev/null || true; done
  for p; do [ -z "$p" ] || wait "$p" 2>/dev/null || true; done
}

# metric PORT NAME: the sum of a Prometheus sample of the server on PORT (0 if absent).
# metric PORT NAME: a counter's value (summed over its labels); with TOKEN set (a server
# with tokens), the read carries it.
metric() {
  local auth=()
  [ -z "${TOKEN:-}" ] || auth=(-H "Authorization: Bearer $TOKEN")
  curl -s "${auth[@]}" "localhost:$1/metrics" | awk -v n="$2" '$1 == n {s += $2} END {printf "%d\n", s}'
}

# rotation ROUND N: 0 … N-1 rotated by ROUND - 1, the order of N variants in that round, so
# that each goes first as often as the others and a machine's drift over the run (busier
# neighbours, tables growing) falls on all alike.
rotation() {
  local k
  for k in $(seq 0 $(($2 - 1))); do printf '%s ' $(((k + $1 - 1) % $2)); done
  echo
}

# ab_order ROUND: the two sides of an A/B comparison in this round's order (rotation of 2):
# A B in odd rounds, B A in even ones. Every script comparing two things side by side
# alternates with it; scripts/bench-request-cost.sh is the harness for two server binaries.
ab_order() { rotation "$1" 2 | sed 's/0/A/; s/1/B/; s/ $//'; }

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

# pg_settings BASE_URL [NAME...]: the Postgres settings a record states, as name=value pairs
# in the order of their names: max_wal_size, checkpoint_timeout, shared_buffers,
# synchronous_commit, fsync and the NAMEs given.
pg_settings() {
  local base=$1 names="'max_wal_size', 'checkpoint_timeout', 'shared_buffers', 'synchronous_commit', 'fsync'" n
  shift
  for n; do names+=", '$n'"; done
  psql "$base/postgres" -Atc "select string_agg(name || '=' || current_setting(name), ', ' order by name) from pg_settings where name in ($names)"
}

# tree_ticks PID: CPU ticks of a process, of its live children, and of the children it has
# already reaped (cutime, cstime): for a postmaster, every process of its cluster
# (backends, walwriter, checkpointer, autovacuum), and none of the machine's other clusters.
tree_ticks() {
  local c t
  t=$(awk '{print $14 + $15 + $16 + $17}' "/proc/$1/stat" 2>/dev/null || echo 0)
  for c in $(pgrep -P "$1"); do t=$((t + $(proc_ticks "$c"))); done
  echo "$t"
}

# load_rows DB_URL ROWS: ROWS service requests spread over the last 24 hours across the
# workflows claims, refunds, payouts, audits (and rare, one in a thousand): 90% COMPLETED,
# 5% FAILED, 3% CANCELLED, 2% NEW, written straight into the table, then VACUUM ANALYZE.
load_rows() {
  local ROWS=$2 cols="" vals=""
  # LABELS=1: every other request labelled with its order (one request each) and one of ten
  # tenants (50,000 requests each in a million); the rest without labels.
  if [ "${LABELS:-0}" = 1 ]; then
    cols=", labels"
    vals=", CASE WHEN g % 2 = 0 THEN ARRAY['order:' || (g / 2), 'tenant:t' || (g % 20) / 2] END"
  fi
  # UUIDv7 ids from each row's creation millisecond (random low bits), as the server makes them.
  psql "$1" -qAt <<SQL
INSERT INTO service_requests (id, workflow_name, status, payload, created_at, updated_at, finished_at, current_step_id$cols)
SELECT (lpad(to_hex((extract(epoch FROM t) * 1000)::bigint), 12, '0') || '7' ||
        substr(md5(g::text), 1, 3) || '8' || substr(md5(g::text), 4, 15))::uuid,
       CASE WHEN g % 1000 = 7 THEN 'rare' ELSE (ARRAY['claims', 'refunds', 'payouts', 'audits'])[1 + g % 4] END,
       CASE WHEN g % 100 < 90 THEN 'COMPLETED' WHEN g % 100 < 95 THEN 'FAILED'
            WHEN g % 100 < 98 THEN 'CANCELLED' ELSE 'NEW' END,
       '{"claimDetails":{"claimType":"MOTOR","amount":1250.75}}', t, t,
       CASE WHEN g % 100 < 98 THEN t END, 0$vals
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
  fresh_db "$base" "$db"
  # shellcheck disable=SC2064  # the values now: the trap runs after this function returns
  trap "kill \${server_pid:-} 2>/dev/null || true; scripts/dev-postgres.sh stop $pg_dir >/dev/null" EXIT
  serve "$port" "/tmp/$tag-server.log" "$bin/clamp" --port "$port" --bind 127.0.0.1 --database-url "$base/$db" --max-running 0
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

# start_nginx DIR SERVERS: the downstream: nginx with one worker, no access log and
# connections kept open, serving the `server { ... }` blocks SERVERS, its files under DIR;
# sets nginx_pid (stop it with `stop`).
start_nginx() {
  local dir=$1
  mkdir -p "$dir/logs"
  cat > "$dir/nginx.conf" <<NGINX
worker_processes 1;
daemon off;
pid $dir/nginx.pid;
error_log $dir/logs/error.log;
events { worker_connections 8192; }
http {
  access_log off;
  keepalive_requests 1000000;
  client_body_temp_path $dir/body;
  proxy_temp_path $dir/proxy;
  fastcgi_temp_path $dir/fastcgi;
  uwsgi_temp_path $dir/uwsgi;
  scgi_temp_path $dir/scgi;
  $2
}
NGINX
  nginx -p "$dir" -c "$dir/nginx.conf" -e "$dir/logs/error.log" &
  nginx_pid=$!
}
