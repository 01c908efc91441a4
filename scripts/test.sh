#!/usr/bin/env bash
# Sets up everything (scripts/setup.sh) and runs the whole etm-bpf test suite: formatting,
# clippy, and every unit, conformance and end-to-end test.
# A test that cannot run here says why (SKIP: ...); under CI=true such a test fails instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
export ETM_BPF_SHARED="${ETM_BPF_SHARED:-$(cd .. && pwd)/shared}"
rc=0
cargo fmt --all --check || { echo "test.sh: cargo fmt --check found unformatted code" >&2; rc=1; }
cargo clippy --release --locked --workspace --all-targets -- -D warnings || { echo "test.sh: clippy warnings" >&2; rc=1; }
# The end-to-end tests run the release binary.
cargo build --release --locked -p etm-bpf
log=$(mktemp)
skips=$(mktemp)
trap 'rm -f "$log" "$skips"' EXIT
export ETM_BPF_SKIP_LOG="$skips"
# Root tests share kernel state (perf events, BPF maps): one test thread per binary for them.
cargo test --release --locked --workspace --no-fail-fast -- --test-threads=1 2>&1 | tee "$log" || rc=$?
# The kernel lab: Debian's arm64 kernel under qemu-system-aarch64 running the product and its
# kernel-facing tests (lab/src/suite.rs); its lines say what ran on which kernel.
cargo xtask lab arm64 2>&1 | tee -a "$log" | grep -v '^warning: etm-bpf@' || rc=1
if [ -s "$skips" ]; then
  echo "run-time skips:"
  sed 's/^/  /' "$skips"
fi
# One closing line over all test binaries ("ignored" are the benchmarks, marked #[ignore]).
awk -v skipped="$(wc -l < "$skips")" '/^test result:/ { p += $4; f += $6; i += $8 }
  END { printf "tests: %d passed, %d failed, %d ignored, %d skipped at run time\n", p, f, i, skipped }' "$log"
grep '^lab arm64: .* checks, ' "$log" || echo "lab arm64: did not finish"

exit "$rc"
