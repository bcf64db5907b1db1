#!/usr/bin/env bash
# A throwaway RabbitMQ node that speaks AMQP over TLS only, beside the machine's own node
# (which it leaves alone), for the amqps:// tests. The caller brings the certificates.
#
#   scripts/rabbitmq-tls.sh start DIR CA_PEM CERT_PEM KEY_PEM   # prints the TLS port
#   scripts/rabbitmq-tls.sh stop  DIR                           # stops it, removes DIR
#
# The node keeps everything under DIR (its database, logs, Erlang cookie) and listens on
# 127.0.0.1 only; its distribution port is a free one (the default, 25672, is the machine
# node's). It runs as the calling user: the scripts under /usr/lib/rabbitmq/bin are called
# directly, since /usr/sbin's switch to the rabbitmq user (which cannot read the keys).
# Starting takes about 7 s of CPU on 2 cores.
set -euo pipefail

RMQ=/usr/lib/rabbitmq/bin
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

usage() {
  echo "usage: $0 start DIR CA_PEM CERT_PEM KEY_PEM | stop DIR" >&2
  exit 2
}

case "${1:-}" in
  start)
    [ $# = 5 ] || usage
    dir=$(realpath -m "$2")
    mkdir -p "$dir"/{mnesia,log,home}
    tls_port=$(free_port)
    dist_port=$(free_port)
    node="clamp-tls-$$@localhost"
    cat > "$dir/rabbitmq.conf" <<CONF
listeners.tcp = none
listeners.ssl.default = 127.0.0.1:$tls_port
ssl_options.cacertfile = $3
ssl_options.certfile = $4
ssl_options.keyfile = $5
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
CONF
    echo '[].' > "$dir/enabled_plugins"
    : > "$dir/rabbitmq-env.conf"
    head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/home/.erlang.cookie"
    chmod 400 "$dir/home/.erlang.cookie"
    cat > "$dir/env" <<ENV
export HOME=$dir/home
export RABBITMQ_CONF_ENV_FILE=$dir/rabbitmq-env.conf
export RABBITMQ_NODENAME=$node
export RABBITMQ_DIST_PORT=$dist_port
export RABBITMQ_CONFIG_FILE=$dir/rabbitmq.conf
export RABBITMQ_ADVANCED_CONFIG_FILE=$dir/advanced.config
export RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins
export RABBITMQ_MNESIA_BASE=$dir/mnesia
export RABBITMQ_LOG_BASE=$dir/log
export RABBITMQ_PID_FILE=$dir/rabbit.pid
export ERL_CRASH_DUMP=$dir/erl_crash.dump
export ERL_EPMD_ADDRESS=127.0.0.1
export ERL_FLAGS="-kernel inet_dist_use_interface {127,0,0,1}"
ENV
    # shellcheck disable=SC1091
    . "$dir/env"
    cd "$dir"
    "$RMQ/rabbitmq-server" -detached
    # Up when the TLS port takes connections (the listeners start last); a crash dump or a
    # dead VM means it will not come up.
    for _ in $(seq 600); do
      if (exec 3<>"/dev/tcp/127.0.0.1/$tls_port") 2>/dev/null; then
        echo "$tls_port"
        exit 0
      fi
      if [ -e "$ERL_CRASH_DUMP" ] || { [ -s "$RABBITMQ_PID_FILE" ] && ! kill -0 "$(cat "$RABBITMQ_PID_FILE")" 2>/dev/null; }; then
        sleep 2
        echo "rabbitmq-tls: the node did not boot; see $dir/log" >&2
        grep -h -A3 'BOOT FAILED' "$dir"/log/*.log >&2 2>/dev/null || true
        exit 1
      fi
      sleep 0.1
    done
    echo "rabbitmq-tls: no TLS listener on $tls_port after 60 s; see $dir/log" >&2
    exit 1
    ;;
  stop)
    [ $# = 2 ] || usage
    dir=$(realpath -m "$2")
    if [ -f "$dir/env" ]; then
      # shellcheck disable=SC1091
      . "$dir/env"
      pid=$(cat "$RABBITMQ_PID_FILE" 2>/dev/null || true)
      if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        # SIGTERM is a graceful stop; give it 15 s, then make sure.
        kill -TERM "$pid"
        for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
      fi
    fi
    rm -rf "$dir"
    ;;
  *)
    usage
    ;;
esac
