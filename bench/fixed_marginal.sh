#!/usr/bin/env bash
# A trace window's cost split into a fixed part per window and a part per traced instruction:
# bench/pipeline_window.sh at WINDOW=1000 and WINDOW=10000 (same program and options), then
# bench/fixed_marginal.py on both (bench/README.md, "Packets that start every window").
#
#   bench/fixed_marginal.sh [replay args]     e.g. --no-exact --no-synth-samples
#
# Env: PROG, ETM_BPF_BIN as for bench/pipeline_window.sh; N (rows, default 25).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
for t in aarch64-linux-gnu-gcc qemu-aarch64 valgrind callgrind_annotate python3; do
    command -v "$t" >/dev/null || { echo "SKIP: $t not installed (scripts/setup.sh)"; exit 0; }
done
dirs=()
for w in 1000 10000; do
    log=$(mktemp)
    KEEP=1 WINDOW=$w bash -x "$HERE/pipeline_window.sh" "$@" > "$log" 2>&1 || { cat "$log"; exit 1; }
    grep -E '^(indirect|loops),' "$log"
    dirs+=("$(sed -n 's/^+ WORK=//p' "$log" | head -1)")
    rm -f "$log"
done
python3 "$HERE/fixed_marginal.py" "${dirs[0]}" "${dirs[1]}" "${N:-25}"
rm -rf "${dirs[@]}"
