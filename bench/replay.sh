#!/usr/bin/env bash
# Replay benchmark: CPU cost of the one pipeline (ETE decode -> join -> profile) per trace
# window, and what it means per second of target execution at realistic window rates.
#
#   bench/replay.sh            (needs aarch64-linux-gnu-gcc and qemu-aarch64: scripts/setup.sh)
#
# Method: `etm-bpf synth` runs tests/aarch64/indirect.c (calls through a function-pointer
# table: ~200 taken branches per 1,000 instructions) under qemu for two run lengths and writes
# sessions with a 1,000-instruction window every 2,000 instructions. `etm-bpf replay --headless --json` reports the time of its event
# loop (best of 5) on both; the *marginal* cost per window = (cpu(long) - cpu(short)) / (windows(long) -
# windows(short)) removes fixed costs. The replay driver also
# parses events.jsonl, which the live driver does not, so this is an upper bound of the live
# pipeline's cost.
#
# Per second of target execution, a CPU running at F GHz with a 1,000-cycle window every
# P cycles produces F*1e9/P windows/s; the pipeline's share of one core is that rate times the
# cost per window (a 1,000-cycle window holds ~1,000 instructions at IPC 1, as here).
set -euo pipefail
. "$(dirname "$0")/etm_bpf_bin.sh"
command -v aarch64-linux-gnu-gcc >/dev/null || { echo "SKIP: aarch64-linux-gnu-gcc not installed (scripts/setup.sh)"; exit 0; }
command -v qemu-aarch64 >/dev/null || { echo "SKIP: qemu-aarch64 not installed (scripts/setup.sh)"; exit 0; }
WORK=$(mktemp -d /tmp/etm-replay-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
FREQ_GHZ=${FREQ_GHZ:-3}
# PROG: indirect (branchy: calls through a function-pointer table) or loops (long counted
# loops, data-dependent conditions); SHORT/LONG: its argument for the two runs.
PROG=${PROG:-indirect}
case $PROG in
    indirect) SHORT=${SHORT:-30000}; LONG=${LONG:-150000} ;;
    loops) SHORT=${SHORT:-20}; LONG=${LONG:-100} ;;
    *) echo "PROG must be indirect or loops"; exit 2 ;;
esac
# RETSTACK=0 turns return-stack compression off in the generated trace (default on, as
# perf's cs_etm default).
RS_FLAG=
[ "${RETSTACK:-1}" = 0 ] && RS_FLAG=--no-retstack
WINDOW=${WINDOW:-1000}

aarch64-linux-gnu-gcc -O2 -static -fno-omit-frame-pointer -o "$WORK/$PROG" "$ROOT/tests/aarch64/$PROG.c"
for n in "$SHORT" "$LONG"; do
    "$ETM_BPF_BIN" synth --out "$WORK/s$n" --window "$WINDOW" --period $((2 * WINDOW)) $RS_FLAG -- "$WORK/$PROG" "$n" | tail -1
done

# best-of-5 seconds of a replay's event loop (the summary's elapsed_s: reading events and
# pushing them through the pipeline, single-threaded and CPU-bound, so wall = CPU time)
cpu() {
    local best=
    for _ in 1 2 3 4 5; do
        "$ETM_BPF_BIN" replay "$1" --headless --json > "$WORK/j"
        local t
        t=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['elapsed_s'])" "$WORK/j")
        if [ -z "$best" ] || awk -v a="$t" -v b="$best" 'BEGIN{exit !(a<b)}'; then best=$t; fi
    done
    echo "$best"
}
field() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval('d'+sys.argv[2]))" "$WORK/j" "$1"; }

c1=$(cpu "$WORK/s$SHORT"); w1=$(field '["join"]["samples"]'); b1=$(field '["aux"]["bytes"]'); j1=$(field '["join"]["joined"]'); r1=$(field '["join"]["rejected"]')
c2=$(cpu "$WORK/s$LONG"); w2=$(field '["join"]["samples"]'); b2=$(field '["aux"]["bytes"]'); j2=$(field '["join"]["joined"]'); r2=$(field '["join"]["rejected"]'); br=$(field '["decode"]["branches"]')
# Load-independent: instructions executed (callgrind), marginal per window.
i1=0; i2=0
if command -v valgrind >/dev/null; then
    irs() {
        valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.$2" "$ETM_BPF_BIN" replay "$1" --headless > /dev/null 2>&1
        awk '/^(summary|totals):/ {print $2; exit}' "$WORK/cg.$2"
    }
    i1=$(irs "$WORK/s$SHORT" 1); i2=$(irs "$WORK/s$LONG" 2)
fi
WINDOW=$WINDOW python3 - "$c1" "$w1" "$b1" "$c2" "$w2" "$b2" "$j1" "$r1" "$j2" "$r2" "$br" "$FREQ_GHZ" "$i1" "$i2" <<'EOF'
import os, sys
c1, w1, b1, c2, w2, b2, j1, r1, j2, r2, br, f, i1, i2 = map(float, sys.argv[1:])
print(f"load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (wall times scale with it)")
per_w = (c2 - c1) / (w2 - w1)
per_b = (c2 - c1) / (b2 - b1)
print(f"short: {w1:.0f} windows, {b1:.0f} AUX bytes, joined {j1:.0f}, rejected {r1:.0f}, cpu {c1:.3f} s")
print(f"long:  {w2:.0f} windows, {b2:.0f} AUX bytes, joined {j2:.0f}, rejected {r2:.0f}, cpu {c2:.3f} s ({br:.0f} branches)")
print(f"marginal cost: {per_w*1e6:.1f} us/window, {per_b*1e9:.0f} ns/AUX byte, {1/per_w:.0f} windows/s, {1/per_b/1e6:.1f} MB/s of AUX per core")
for period in (1_000_000, 100_000):
    rate = f * 1e9 / period
    print(f"{f:.0f} GHz, 1,000-cycle window every {period:,} cycles: {rate:,.0f} windows/s per CPU -> {100*rate*per_w:.2f}% of one core per traced CPU (measured time)")
if i2 > i1 > 0:
    irw = (i2 - i1) / (w2 - w1)
    win = float(os.environ.get("WINDOW", "1000"))
    print(f"callgrind: {irw:,.0f} instructions/window, {irw / win:,.1f} per traced instruction, {(i2 - i1) / (br * (w2 - w1) / w2):,.0f} per branch record")
    for period in (1_000_000, 100_000):
        rate = f * 1e9 / period
        # at 1 instruction per cycle on a 3 GHz host core
        print(f"  every {period:,} cycles: {rate * irw / 3e9 * 100:.2f}% of a 3 GHz core at IPC 1")
EOF
# Where the instructions go: marginal inclusive cost per window of the pipeline's stages.
if [ "$i1" != 0 ] && command -v callgrind_annotate >/dev/null; then
    python3 - "$WORK/cg.1" "$WORK/cg.2" "$w1" "$w2" <<'EOF'
import re, subprocess, sys
def incl(path):
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", path], capture_output=True, text=True).stdout
    d = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+\S*?:(.*?)( \(\d[\d,]*x\))?( \[.*\])?$", line)
        if m:
            d[m.group(2)] = max(d.get(m.group(2), 0), int(m.group(1).replace(",", "")))
    return d
a, b = incl(sys.argv[1]), incl(sys.argv[2])
dw = float(sys.argv[4]) - float(sys.argv[3])
rows = [
    ("pipeline: AUX bytes -> profile (Pipeline::push_aux)", "etm_session::pipeline::Pipeline::push_aux"),
    ("  decode: deformat, parse, element decode, branch records (EtmWindowDecoder::feed)", "<etm_session::decoder::EtmWindowDecoder as etm_session::window::WindowDecoder>::feed"),
    ("  join at segment begin: resolve, validate, profile + trie (Joiner::resolve_front)", "etm_session::join::Joiner::resolve_front"),
    ("    validation (join::validate)", "etm_session::join::validate"),
    ("    profile + context trie (Sink::accept)", "etm_session::pipeline::Sink::accept"),
    ("      profile add, pause and synthesized samples (HybridProfile::add_inner)", "etm_profile::model::HybridProfile::add_inner"),
    ("        llvm-profgen's unwinder, one binary's branches (BinaryAgg::walk_fast)", "etm_profile::agg::BinaryAgg::walk_fast"),
    ("reading events.jsonl (replay only: SessionReader::next_event)", "etm_session::session::SessionReader::next_event"),
]
print("callgrind breakdown, instructions per window (inclusive; indented rows are parts of the row above):")
for label, fn in rows:
    if fn in b:
        print(f"  {(b[fn] - a.get(fn, 0)) / dw:>10,.0f}  {label}")
EOF
fi
