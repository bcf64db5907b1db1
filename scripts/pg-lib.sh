# shellcheck shell=bash
# Helpers the throwaway-cluster scripts share (dev-postgres.sh, pg-replica.sh; sourced).

# find_bin: the directory of this machine's PostgreSQL server binaries (initdb, pg_ctl, …).
find_bin() {
  local d
  for d in /usr/lib/postgresql/*/bin /usr/local/pgsql/bin /usr/pgsql-*/bin; do
    if [ -x "$d/initdb" ]; then echo "$d"; return 0; fi
  done
  if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return 0; fi
  echo "$(basename "$0"): no PostgreSQL server binaries found (apt-get install postgresql)" >&2
  return 1
}
