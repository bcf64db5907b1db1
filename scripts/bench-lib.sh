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
