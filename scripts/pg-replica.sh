#!/usr/bin/env bash
# A throwaway primary and synchronous standby from this machine's PostgreSQL binaries, for
# failover tests: start them, kill the primary's host (SIGKILL, every process at once),
# promote the standby, and remove them. Trust authentication on 127.0.0.1; the server
# settings are those of scripts/dev-postgres.sh.
#
#   scripts/pg-replica.sh primary DIR PORT                # prints the primary's URL
#   scripts/pg-replica.sh standby DIR PORT PRIMARY_PORT   # a sync standby of it; prints its URL
#   scripts/pg-replica.sh kill    DIR                     # SIGKILL the postmaster and its children
#   scripts/pg-replica.sh freeze  DIR                     # SIGSTOP them: a hung host that still
#                                                         #   completes TCP handshakes
#   scripts/pg-replica.sh thaw    DIR                     # SIGCONT them
#   scripts/pg-replica.sh promote DIR                     # the standby becomes a primary
#   scripts/pg-replica.sh stop    DIR                     # immediate stop (if running)
#
# The standby connects as application_name=clamp_standby, the name the primary's
# synchronous_standby_names waits for. The synchronous settings are given on the primary's
# command line, not in its postgresql.conf: the standby's copy of that file must not name
# a synchronous standby, or once promoted (with no standby of its own) every commit would
# wait forever.
set -euo pipefail

STANDBY_NAME=clamp_standby

. "$(dirname "$0")/pg-lib.sh"

bin=$(find_bin)
# initdb and postgres refuse to run as root: run them as the postgres user when root.
as=()
if [ "$(id -u)" = 0 ]; then
  id postgres >/dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql postgres
  as=(runuser -u postgres --)
fi

# A directory the server's user owns.
make_dir() {
  mkdir -p "$1"
  [ "$(id -u)" = 0 ] && chown postgres "$1"
  chmod 700 "$1"
}

# Starts the cluster in $1 on port $2, with further server options $3.
start() {
  "${as[@]}" "$bin/pg_ctl" -D "$1" -l "$1/server.log" -w -t 30 \
    -o "-p $2 -c listen_addresses=127.0.0.1 -k $1 -c max_connections=200 -c max_wal_size=8GB -c checkpoint_timeout=15min $3" \
    start >/dev/null
}

usage() {
  echo "usage: $0 primary DIR PORT | standby DIR PORT PRIMARY_PORT | kill DIR | freeze DIR | thaw DIR | promote DIR | stop DIR" >&2
  exit 2
}

cmd=${1:-}
case "$cmd" in
  primary)
    [ $# = 3 ] || usage
    dir=$2 port=$3
    make_dir "$dir"
    "${as[@]}" "$bin/initdb" -D "$dir" -U postgres --auth=trust -E UTF8 >/dev/null
    cat >> "$dir/postgresql.conf" <<EOF
wal_level = replica
max_wal_senders = 10
EOF
    echo "host replication all 127.0.0.1/32 trust" >> "$dir/pg_hba.conf"
    start "$dir" "$port" "-c synchronous_commit=on -c synchronous_standby_names=$STANDBY_NAME"
    echo "postgres://postgres@127.0.0.1:$port/clamp"
    ;;
  standby)
    [ $# = 4 ] || usage
    dir=$2 port=$3 primary_port=$4
    make_dir "$dir"
    # -R writes standby.signal and a primary_conninfo; the line appended after it (the
    # last one wins) names this standby as the primary expects. -c fast: the backup's
    # checkpoint is taken at once, not spread over minutes. The primary's socket file is
    # in its directory, and not copied (pg_basebackup says so; that line is dropped).
    "${as[@]}" "$bin/pg_basebackup" -h 127.0.0.1 -p "$primary_port" -U postgres -D "$dir" \
      -R -X stream -c fast 2> >(grep -v 'skipping special file' >&2)
    echo "primary_conninfo = 'host=127.0.0.1 port=$primary_port user=postgres application_name=$STANDBY_NAME'" \
      >> "$dir/postgresql.auto.conf"
    start "$dir" "$port" ""
    echo "postgres://postgres@127.0.0.1:$port/clamp"
    ;;
  kill)
    [ $# = 2 ] || usage
    dir=$2
    pid=$(head -n 1 "$dir/postmaster.pid")
    # Stopped first, the postmaster forks no new child while its children are listed;
    # then all of them die at once, as when the host goes away.
    kill -STOP "$pid"
    # shellcheck disable=SC2046
    kill -KILL "$pid" $(pgrep -P "$pid" || true)
    # Gone, or a zombie (its parent, often init, may reap it late or never).
    for _ in $(seq 500); do
      state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || echo gone)
      [ "$state" = gone ] || [ "$state" = Z ] && break
      sleep 0.01
    done
    ;;
  freeze|thaw)
    [ $# = 2 ] || usage
    pid=$(head -n 1 "$2/postmaster.pid")
    sig=STOP
    [ "$cmd" = thaw ] && sig=CONT
    # The postmaster first (so it forks nothing meanwhile), then every child it has.
    kill -$sig "$pid"
    # shellcheck disable=SC2046
    kill -$sig $(pgrep -P "$pid" || true) 2>/dev/null || true
    ;;
  promote)
    [ $# = 2 ] || usage
    "${as[@]}" "$bin/pg_ctl" -D "$2" -w -t 30 promote >/dev/null
    ;;
  stop)
    [ $# = 2 ] || usage
    dir=$2
    if [ -f "$dir/postmaster.pid" ]; then
      "${as[@]}" "$bin/pg_ctl" -D "$dir" -m immediate -w -t 30 stop >/dev/null 2>&1 || true
    fi
    ;;
  *)
    usage
    ;;
esac
