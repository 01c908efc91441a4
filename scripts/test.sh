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
cargo test --release --locked --workspace --no-fail-fast -- --test-threads=1
