#!/usr/bin/env bash
# Replay throughput against the decode threads: per-CPU trace streams decoded on a worker
# pool (`replay --decode-threads N`), the join and the profile on the main thread.
#
#   bench/decode_threads.sh       # env: ETM_BPF_BIN, CPUS="2 4", THREADS="1 2", MS=40, RUNS=5
#
# Method: `hw_session` (the driver model, `etm_synth::hw_run`: three processes, TRBE per CPU)
# writes a session per CPU count; `etm-bpf replay --headless --json` runs on each with every
# thread count in turn, RUNS rounds, interleaved (so a load change hits all alike); the best
# `elapsed_s` (the event loop, wall) of each is reported with windows/s = pause samples /
# elapsed. The dumps of every thread count are compared with those of the first (all files
# but manifest.json's timing fields): they must be identical. EXTRA: more replay flags
# (e.g. --no-synth-samples).
set -euo pipefail
. "$(dirname "$0")/etm_bpf_bin.sh"
(cd "$ROOT" && cargo build --release -q -p etm-synth --example hw_session)
HW=$CARGO_TARGET_DIR/release/examples/hw_session
CPUS=${CPUS:-2 4}
THREADS=${THREADS:-1 2}
MS=${MS:-40}
RUNS=${RUNS:-5}
EXTRA=${EXTRA:-}
WORK=$(mktemp -d /tmp/etm-threads-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
echo "host: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for c in $CPUS; do
    "$HW" "$WORK/s$c" trbe "$c" "$MS" >/dev/null
    for t in $THREADS; do echo 1e9 >"$WORK/best.$c.$t"; done
    for r in $(seq "$RUNS"); do
        for t in $THREADS; do
            rm -rf "$WORK/d.$c.$t"
            # shellcheck disable=SC2086
            "$ETM_BPF_BIN" replay "$WORK/s$c" --headless --json --decode-threads "$t" --dump-dir "$WORK/d.$c.$t" $EXTRA >"$WORK/j.$c.$t"
            python3 - "$WORK/j.$c.$t" "$WORK/best.$c.$t" <<'EOF'
import json, sys
e = json.load(open(sys.argv[1]))["elapsed_s"]
b = float(open(sys.argv[2]).read())
open(sys.argv[2], "w").write(str(min(b, e)))
EOF
        done
    done
    first=${THREADS%% *}
    for t in $THREADS; do
        python3 - "$WORK/d.$c.$first" "$WORK/d.$c.$t" <<'EOF'
import json, os, sys
a, b = sys.argv[1], sys.argv[2]
def strip(v):
    if isinstance(v, dict):
        return {k: strip(x) for k, x in v.items() if not (k.endswith("_s") or k.endswith("_us") or k in ("elapsed", "wall"))}
    if isinstance(v, list):
        return [strip(x) for x in v]
    return v
names = sorted(os.listdir(a))
assert names == sorted(os.listdir(b)), (names, os.listdir(b))
for n in names:
    x, y = open(os.path.join(a, n), "rb").read(), open(os.path.join(b, n), "rb").read()
    if n == "manifest.json":
        x, y = strip(json.loads(x)), strip(json.loads(y))
    assert x == y, f"{n} differs: {a} vs {b}"
EOF
        python3 - "$c" "$t" "$WORK/j.$c.$t" "$WORK/best.$c.$t" <<'EOF'
import json, sys
c, t, j, b = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3])), float(open(sys.argv[4]).read())
w = j["join"]["samples"]
print(f"cpus {c} threads {t}: {w} windows, {j['aux']['bytes']} AUX bytes, best {b * 1e3:.1f} ms, {w / b:,.0f} windows/s, dumps identical")
EOF
    done
done
