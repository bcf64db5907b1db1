#!/usr/bin/env bash
# Makes sure the services the tests need are installed and running on this machine:
# PostgreSQL on 127.0.0.1:5432 (trust auth for local TCP), RabbitMQ on 127.0.0.1:5672,
# the `tansu` Kafka-protocol broker binary (the Kafka tests start their own broker
# from it; no Kafka broker comes from Debian), the OpenAPI, console and tracing test
# tools (PyPI), and a headless browser for the console tests (Debian's chromium and
# chromium-driver).
# Safe to run again; installs only what is missing (Debian packages, tansu from
# crates.io, the Python tools from PyPI).
set -euo pipefail

log() { echo "services: $*" >&2; }
sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_updated=0
apt_install() {
  if [ $apt_updated = 0 ]; then sudo_ apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive sudo_ apt-get install -y -qq "$@" >/dev/null
}

pg_up() { pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; }

ensure_postgres() {
  if ! command -v pg_ctlcluster >/dev/null 2>&1 || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    log "installing PostgreSQL"
    apt_install postgresql postgresql-client
  fi
  local ver
  ver=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -1 || true)
  if [ -z "$ver" ]; then
    ver=$(ls /usr/lib/postgresql | sort -V | tail -1)
    sudo_ pg_createcluster "$ver" main >/dev/null
  fi
  local hba=/etc/postgresql/$ver/main/pg_hba.conf
  # The tests connect as postgres over TCP without a password (a fresh Debian cluster
  # asks for one on 127.0.0.1, whether or not the package already started it).
  if [ -f "$hba" ] && ! grep -q "clamp-tests" "$hba"; then
    sudo_ sed -i '1i host all all 127.0.0.1/32 trust # clamp-tests\nhost all all ::1/128 trust # clamp-tests' "$hba"
    if pg_up; then sudo_ pg_ctlcluster --skip-systemctl-redirect "$ver" main reload || true; fi
  fi
  if ! pg_up; then
    log "starting PostgreSQL $ver"
    sudo_ pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
    for _ in $(seq 1 30); do pg_up && break; sleep 1; done
  fi
  pg_up || { log "PostgreSQL did not come up on 127.0.0.1:5432"; exit 1; }
  psql -h 127.0.0.1 -U postgres -d postgres -Atqc 'select 1' >/dev/null \
    || { log "cannot log in to PostgreSQL as postgres over TCP (trust auth expected)"; exit 1; }
}

rabbit_up() { (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; }

ensure_rabbitmq() {
  if ! command -v rabbitmq-server >/dev/null 2>&1; then
    log "installing RabbitMQ"
    apt_install rabbitmq-server
  fi
  if ! rabbit_up; then
    log "starting RabbitMQ"
    sudo_ rabbitmq-server -detached >/dev/null 2>&1 || true
    for _ in $(seq 1 60); do rabbit_up && break; sleep 1; done
  fi
  rabbit_up || { log "RabbitMQ did not come up on 127.0.0.1:5672"; return 1; }
}

# The version the Kafka tests were written against; memory storage needs `dynostore`,
# and SQLite storage (`libsql`, the one that keeps SCRAM credentials) the SASL tests.
TANSU_VERSION=0.6.0
TANSU_FEATURES=dynostore,libsql

ensure_tansu() {
  local bin="${CARGO_HOME:-$HOME/.cargo}/bin/tansu"
  local stamp="$bin.features"
  if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "$TANSU_VERSION" \
    && [ "$(cat "$stamp" 2>/dev/null)" = "$TANSU_FEATURES" ]; then
    return 0
  fi
  log "installing the tansu Kafka broker $TANSU_VERSION (cargo install; several minutes, once)"
  cargo install --quiet --locked --force tansu --version "$TANSU_VERSION" \
    --no-default-features --features "$TANSU_FEATURES"
  echo "$TANSU_FEATURES" > "$stamp"
}

# The OpenAPI checks (a validator and a property-based API fuzzer driven by the document),
# the console's browser tests (Selenium, driving chromium through chromium-driver) and the
# OTLP/HTTP trace receiver the tracing tests export to (tests/otlp/receiver.py: the OTLP
# protobuf messages, and the protobuf runtime they are generated for), in a virtualenv of
# their own under target/ (pinned, so the checks do not drift).
PY_TOOLS="$(cd "$(dirname "$0")/.." && pwd)/target/py-tools"
ensure_py_tools() {
  local want="schemathesis==4.32.5 openapi-spec-validator==0.9.0 selenium==4.27.1 opentelemetry-proto==1.45.2 protobuf==7.36.2"
  if [ -x "$PY_TOOLS/bin/schemathesis" ] && [ -f "$PY_TOOLS/.pinned" ] && [ "$(cat "$PY_TOOLS/.pinned")" = "$want" ]; then
    return 0
  fi
  log "installing the Python test tools ($want) into $PY_TOOLS"
  if ! python3 -m venv "$PY_TOOLS" >/dev/null 2>&1; then
    apt_install python3-venv
    python3 -m venv "$PY_TOOLS"
  fi
  "$PY_TOOLS/bin/pip" install -q --disable-pip-version-check $want
  echo "$want" > "$PY_TOOLS/.pinned"
}

# The console tests drive a real headless browser: Debian's chromium and its WebDriver.
ensure_browser() {
  if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    log "installing chromium and chromium-driver (the console's browser tests)"
    apt_install chromium chromium-driver
  fi
}

# The benchmarks (not the tests) load the server with wrk and stand nginx in for a
# downstream service (scripts/bench-request-cost.sh and the scripts beside it).
ensure_bench_tools() {
  local nginx=1
  command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || nginx=0
  if ! command -v wrk >/dev/null 2>&1 || [ "$nginx" = 0 ]; then
    log "installing wrk and nginx (the benchmarks' load generator and downstream)"
    apt_install wrk nginx-light
  fi
}

case "${1:-all}" in
  postgres) ensure_postgres ;;
  rabbitmq) ensure_rabbitmq ;;
  tansu) ensure_tansu ;;
  py-tools) ensure_py_tools ;;
  browser) ensure_browser ;;
  bench-tools) ensure_bench_tools ;;
  all) ensure_postgres; ensure_rabbitmq; ensure_tansu; ensure_py_tools; ensure_browser ;;
  *) echo "usage: $0 [postgres|rabbitmq|tansu|py-tools|browser|bench-tools|all]" >&2; exit 2 ;;
esac
