#!/usr/bin/env bash
# Profile model benchmark: aggregation cost per hybrid sample, dump time of the three writers
# and peak memory for a large synthetic profile (default 1M samples over 100k contexts, stacks
# of 4-19 frames, 16 branches each). Figures go to bench/README.md, section "Profile".
# Usage: bench/profile.sh [SAMPLES CONTEXTS]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
cargo build --release -p etm-write --example bench_profile
bin="${CARGO_TARGET_DIR:-target}/release/examples/bench_profile"
if [ -x /usr/bin/time ]; then
  /usr/bin/time -f "max RSS (time -f %%M): %M KiB, elapsed %e s, user %U s, sys %S s" "$bin" "$@"
else
  "$bin" "$@"   # peak RSS is also printed by the program (VmHWM)
fi
