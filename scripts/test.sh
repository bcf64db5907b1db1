#!/usr/bin/env bash
# Runs every test: starts (installing if needed) the services the tests talk to, then
# the whole workspace's unit and integration tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh all
exec cargo test --workspace --locked "$@"
