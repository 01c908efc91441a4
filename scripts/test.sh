#!/usr/bin/env bash
# Sets up everything (scripts/setup.sh) and runs the whole etm-bpf test suite.
# Tests that need root, a kernel feature or a tool print why they skip.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
export ETM_BPF_SHARED="${ETM_BPF_SHARED:-$(cd .. && pwd)/shared}"
# The end-to-end tests run the release binary.
cargo build --release --locked -p etm-bpf
# Root tests share kernel state (perf events, BPF maps): one test thread per binary for them.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
rc=0
cargo test --release --locked --workspace --no-fail-fast -- --test-threads=1 2>&1 | tee "$log" || rc=$?
# One closing line over all test binaries ("ignored" are the benchmarks and skips-by-attribute;
# run-time skips print "SKIP:" with their reason above).
awk '/^test result:/ { p += $4; f += $6; i += $8 } END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, i }' "$log"
exit "$rc"
