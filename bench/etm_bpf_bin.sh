# Sourced by the replay benchmarks: ROOT (the repo), CARGO_TARGET_DIR (exported; default
# ROOT/target) and ETM_BPF_BIN (the binary to measure; built in release if not given).
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
if [ -z "${ETM_BPF_BIN:-}" ]; then
    (cd "$ROOT" && cargo build --release -q -p etm-bpf)
    ETM_BPF_BIN=$CARGO_TARGET_DIR/release/etm-bpf
fi
