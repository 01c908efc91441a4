#!/usr/bin/env bash
# The pipeline's cost on sessions shaped like hardware (the driver model, `etm_synth::hw_run`:
# three processes with threads scaled to the CPUs; most of the trace is other processes'),
# deterministic: callgrind's *inclusive* instructions of `Pipeline::push_aux` over the whole
# replay (AUX bytes -> decode -> join -> profile, trie, exact counts), and the replay's peak
# RSS. The figures of bench/README.md's "Integer maps in the session" and "Trace of contexts
# without code" come from this script.
#
#   bench/hw_replay.sh [replay args]
#
# Env: SESSIONS (default "trbe:4 trbe:64 etr:16 etr:64"), MS (model time, default 10),
# ETM_BPF_BIN. Needs valgrind (scripts/setup.sh installs it).
set -euo pipefail
. "$(dirname "$0")/etm_bpf_bin.sh"
for t in valgrind callgrind_annotate /usr/bin/time; do
    command -v "$t" >/dev/null || { echo "SKIP: $t not installed (scripts/setup.sh)"; exit 0; }
done
SESSIONS=${SESSIONS:-trbe:4 trbe:64 etr:16 etr:64}
MS=${MS:-10}
WORK=$(mktemp -d /tmp/etm-hw-replay.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
(cd "$ROOT" && cargo build --release -q -p etm-synth --example hw_session)
printf '%-8s %5s %6s %16s %10s\n' sink cpus ms push_aux_Ir peak_RSS
for s in $SESSIONS; do
    kind=${s%%:*}; cpus=${s##*:}
    d=$WORK/$kind$cpus
    "$CARGO_TARGET_DIR/release/examples/hw_session" "$d" "$kind" "$cpus" "$MS" > /dev/null
    valgrind --tool=callgrind --callgrind-out-file="$WORK/cg" "$ETM_BPF_BIN" replay "$d" --headless "$@" > /dev/null 2>&1
    ir=$(callgrind_annotate --inclusive=yes "$WORK/cg" 2>/dev/null | grep -F 'Pipeline::push_aux [' | head -1 | awk '{print $1}')
    /usr/bin/time -f '%M' -o "$WORK/rss" "$ETM_BPF_BIN" replay "$d" --headless "$@" > /dev/null 2>&1
    rss=$(tail -1 "$WORK/rss")
    printf '%-8s %5s %6s %16s %7s KiB\n' "$kind" "$cpus" "$MS" "$ir" "$rss"
done
