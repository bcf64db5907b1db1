#!/usr/bin/env bash
# Runs every test: the Python tests of scripts/, then starts (installing if needed) the
# services the tests talk to, then the whole workspace's unit and integration tests, and
# closes with one total line (of the cargo tests).
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python tests of scripts/ first (the bench scripts' arithmetic, scripts/benchmath.py):
# quick, and they need no service; a failure stops the run here (set -e).
python3 -m unittest discover -s scripts -p 'test_*.py'
scripts/services.sh all
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
# Doc tests are left out: the crates have none, and an empty run would close the output.
cargo test --workspace --locked --lib --bins --tests "$@" 2>&1 | tee "$log" || status=$?
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
exit $status
