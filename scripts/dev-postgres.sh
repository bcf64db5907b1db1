#!/usr/bin/env bash
# Starts (or stops) a throwaway PostgreSQL cluster from this machine's PostgreSQL binaries,
# with trust authentication on 127.0.0.1, and prints a DATABASE_URL for it.
#
#   scripts/dev-postgres.sh start [DIR] [PORT]   # default DIR=/tmp/clamp-pg-$PORT, PORT=55432
#   scripts/dev-postgres.sh stop  [DIR]
#   scripts/dev-postgres.sh url   [PORT]
#
# PG_EXTRA_CONF (optional): lines appended to the cluster's postgresql.conf before it is
# started, e.g. PG_EXTRA_CONF="shared_preload_libraries = 'pg_stat_statements'". Unset, the
# cluster is started as always.
# PG_HBA_FIRST (optional): lines put first in pg_hba.conf when the cluster is made (rules
# are matched in order), e.g. PG_HBA_FIRST="hostssl all alice 127.0.0.1/32 cert".
#
# Tests that stop Postgres on purpose use their own cluster from this script, so the
# tests running beside them keep theirs.
set -euo pipefail

. "$(dirname "$0")/pg-lib.sh"

cmd=${1:-start}
case "$cmd" in
  start)
    port=${3:-55432}
    dir=${2:-/tmp/clamp-pg-$port}
    bin=$(find_bin)
    # initdb and postgres refuse to run as root: run them as the postgres user when root.
    as=()
    if [ "$(id -u)" = 0 ]; then
      id postgres >/dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql postgres
      as=(runuser -u postgres --)
    fi
    if [ ! -f "$dir/PG_VERSION" ]; then
      mkdir -p "$dir"
      [ "$(id -u)" = 0 ] && chown postgres "$dir"
      "${as[@]}" "$bin/initdb" -D "$dir" -U postgres --auth=trust -E UTF8 >/dev/null
      if [ -n "${PG_HBA_FIRST:-}" ]; then
        { printf '%s\n' "$PG_HBA_FIRST"; cat "$dir/pg_hba.conf"; } > "$dir/pg_hba.conf.new"
        mv "$dir/pg_hba.conf.new" "$dir/pg_hba.conf"
        [ "$(id -u)" = 0 ] && chown postgres "$dir/pg_hba.conf"
      fi
    fi
    if ! "${as[@]}" "$bin/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
      [ -z "${PG_EXTRA_CONF:-}" ] || printf '%s\n' "$PG_EXTRA_CONF" >> "$dir/postgresql.conf"
      "${as[@]}" "$bin/pg_ctl" -D "$dir" -l "$dir/server.log" -w -t 30 \
        -o "-p $port -c listen_addresses=127.0.0.1 -k $dir -c max_connections=200 -c max_wal_size=8GB -c checkpoint_timeout=15min" start >/dev/null
    fi
    echo "postgres://postgres@127.0.0.1:$port/clamp"
    ;;
  stop)
    dir=${2:-/tmp/clamp-pg-55432}
    bin=$(find_bin)
    as=()
    [ "$(id -u)" = 0 ] && as=(runuser -u postgres --)
    "${as[@]}" "$bin/pg_ctl" -D "$dir" -m fast -w stop >/dev/null 2>&1 || true
    ;;
  url)
    echo "postgres://postgres@127.0.0.1:${2:-55432}/clamp"
    ;;
  *)
    echo "usage: $0 start [DIR] [PORT] | stop [DIR] | url [PORT]" >&2
    exit 2
    ;;
esac
