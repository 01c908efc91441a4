#!/usr/bin/env bash
# Pipeline cost per trace window, deterministic: callgrind's marginal *inclusive* instructions
# of `Pipeline::push_aux` (AUX bytes -> decode -> join -> profile, trie, exact counts) per
# window, between a short and a long synthetic session of the same program, so fixed costs
# cancel. The figures quoted in bench/README.md ("Replay" and the sections after "The
# atom-run loop in the pipeline") come from this script.
#
#   bench/pipeline_window.sh [replay args]     e.g. --no-synth-samples, --no-exact
#
# Env: STAGES=1 also prints the marginal self cost by stage, per window and per branch record
# (bench/stages.py; the branch records from the replay reports);
# KEEP=1 keeps the work directory (sessions, snapshots, callgrind outputs: `bash -x` shows it);
# PROG (indirect: branchy, default; loops: long basic blocks), WINDOW (1000; the
# period is twice it), SHORT/LONG (the program's argument for the two runs; defaults give
# 308 / 1,528 windows of 1,000 for indirect, 75 / 396 for loops), ETM_BPF_BIN.
# Needs aarch64-linux-gnu-gcc, qemu-aarch64 and valgrind (scripts/setup.sh installs them).
set -euo pipefail
. "$(dirname "$0")/etm_bpf_bin.sh"
for t in aarch64-linux-gnu-gcc qemu-aarch64 valgrind callgrind_annotate; do
    command -v "$t" >/dev/null || { echo "SKIP: $t not installed (scripts/setup.sh)"; exit 0; }
done
PROG=${PROG:-indirect}
case $PROG in
    indirect) SHORT=${SHORT:-30000}; LONG=${LONG:-150000} ;;
    loops) SHORT=${SHORT:-20}; LONG=${LONG:-100} ;;
    *) echo "PROG must be indirect or loops"; exit 2 ;;
esac
WINDOW=${WINDOW:-1000}
WORK=$(mktemp -d /tmp/etm-pipeline-window.XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
aarch64-linux-gnu-gcc -O2 -static -fno-omit-frame-pointer -o "$WORK/$PROG" "$ROOT/tests/aarch64/$PROG.c"
run() { # argument -> "windows push_aux_inclusive"
    "$ETM_BPF_BIN" synth --out "$WORK/s$1" --window "$WINDOW" --period $((2 * WINDOW)) --snapshot "$WORK/ss$1" \
        -- "$WORK/$PROG" "$1" > /dev/null
    valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.$1" "$ETM_BPF_BIN" replay "$WORK/s$1" --headless "${@:2}" \
        > "$WORK/out.$1" 2>&1
    local w ir
    w=$(grep -o 'samples [0-9]*' "$WORK/out.$1" | head -1 | awk '{print $2}')
    ir=$(callgrind_annotate --inclusive=yes "$WORK/cg.$1" 2>/dev/null | grep -F 'Pipeline::push_aux [' | head -1 \
        | awk '{gsub(",", "", $1); print $1}')
    echo "$w $ir"
}
dec() { # argument -> whole-process Ir of `decode --stats` of the same trace (the OpenCSD snapshot synth wrote)
    valgrind --tool=callgrind --callgrind-out-file="$WORK/cgd.$1" "$ETM_BPF_BIN" decode --snapshot "$WORK/ss$1" --stats \
        > /dev/null 2>&1
    callgrind_annotate "$WORK/cgd.$1" 2>/dev/null | grep 'PROGRAM TOTALS' | awk '{gsub(",", "", $1); print $1}'
}
read -r w1 i1 < <(run "$SHORT" "$@")
read -r w2 i2 < <(run "$LONG" "$@")
per=$(( (i2 - i1) / (w2 - w1) ))
echo "$PROG, $WINDOW-instruction windows: $w1 / $w2 windows; Pipeline::push_aux, marginal: $per instructions per window, $(awk -v p="$per" -v w="$WINDOW" 'BEGIN { printf "%.1f", p / w }') per traced instruction"
if [ "${STAGES:-0}" = 1 ]; then
    echo "by stage, instructions (self, marginal):"
    b1=$(grep -o 'branches [0-9]*' "$WORK/out.$SHORT" | head -1 | awk '{print $2}')
    b2=$(grep -o 'branches [0-9]*' "$WORK/out.$LONG" | head -1 | awk '{print $2}')
    python3 "$ROOT/bench/stages.py" "$WORK/cg.$SHORT" "$WORK/cg.$LONG" $((w2 - w1)) $((b2 - b1))
fi
# The decoder alone on the same trace, through `etm-bpf decode` (its own sink: counts only),
# marginal the same way: the share of the figure above no later stage can remove.
d1=$(dec "$SHORT"); d2=$(dec "$LONG")
dper=$(( (d2 - d1) / (w2 - w1) ))
echo "$PROG, decoder alone (decode --stats of the same trace), marginal: $dper instructions per window, $(awk -v p="$dper" -v w="$WINDOW" 'BEGIN { printf "%.1f", p / w }') per traced instruction"
