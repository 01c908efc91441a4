#!/usr/bin/env bash
# Decoder benchmark: etm-bpf's Rust ETMv4/ETE decoder vs OpenCSD's trc_pkt_lister (Debian
# libopencsd-bin 1.3.3), side by side on the same trace: the bugfix-exact-match ETR buffer
# (1 MiB, 6 trace IDs, 1.74 M instruction ranges) concatenated N times.
#
#   bench/decoder.sh [N]      (default N=8)
#   CALLGRIND=0 bench/decoder.sh   skips the (slow) valgrind part
#
# Prints wall-clock MB/s (best of 3) and, with valgrind, instructions per trace byte measured
# as the *marginal* cost of the trace: (Ir(1 MiB buffer) - Ir(first 4 KiB only)) / (1 MiB - 4 KiB),
# which removes start-up work (snapshot parsing, loading the 1.9 MB code image) for both tools,
# and for the whole process, start-up included: Ir(1 MiB buffer) / 1 MiB.
set -euo pipefail
N=${1:-8}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${ETM_BPF_SHARED:-$ROOT/../shared}
SRC=$SHARED/testdata/etm/bugfix-exact-match
[ -d "$SRC" ] || { echo "SKIP: $SRC not found (set ETM_BPF_SHARED)"; exit 0; }
command -v trc_pkt_lister >/dev/null || { echo "SKIP: trc_pkt_lister not installed (apt install libopencsd-bin)"; exit 0; }
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$CARGO_TARGET_DIR/release/etm-bpf
if ! (cd "$ROOT" && cargo build --release -q -p etm-bpf); then
    [ -x "$BIN" ] || { echo "build failed and no $BIN"; exit 1; }
    echo "WARNING: build failed; using the existing $BIN"
fi
WORK=$(mktemp -d /tmp/etm-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# snapshot copies whose buffer is the original buffer repeated k times
mk() { # k
    local d=$WORK/x$1
    mkdir -p "$d"
    for f in "$SRC"/*.ini "$SRC"/*.bin; do ln -sf "$f" "$d/"; done
    rm -f "$d/cstrace.bin"
    for _ in $(seq "$1"); do cat "$SRC/cstrace.bin"; done > "$d/cstrace.bin"
    echo "$d"
}
D1=$(mk 1); DN=$(mk "$N")
D0=$WORK/x0; mkdir -p "$D0"; for f in "$SRC"/*.ini "$SRC"/*.bin; do ln -sf "$f" "$D0/"; done
rm -f "$D0/cstrace.bin"; head -c 4096 "$SRC/cstrace.bin" > "$D0/cstrace.bin"
BYTES=$(stat -c %s "$DN/cstrace.bin")
ONE=$(( $(stat -c %s "$D1/cstrace.bin") - 4096 ))

best() { # command... ; prints best-of-3 seconds
    local b=""
    for _ in 1 2 3; do
        local t0 t1
        t0=$(date +%s.%N); "$@" >/dev/null 2>&1 || true; t1=$(date +%s.%N)
        b=$(echo "$t1 - $t0" | bc -l | awk -v b="$b" '{ if (b == "" || $1 < b) print $1; else print b }')
    done
    echo "$b"
}
# the five modes; OpenCSD appends to -logfilename, so always /dev/null
cmd() { # mode dir -> argv (one per line)
    case $1 in
        ocsd_pkt)  printf '%s\n' trc_pkt_lister -ss_dir "$2" -logfilename /dev/null ;;
        ocsd_full) printf '%s\n' trc_pkt_lister -ss_dir "$2" -decode_only -logfilename /dev/null ;;
        ours_pkt)  printf '%s\n' "$BIN" decode --snapshot "$2" --packets --stats ;;
        ours_list) printf '%s\n' "$BIN" decode --snapshot "$2" --no-header ;;
        ours_full) printf '%s\n' "$BIN" decode --snapshot "$2" --stats ;;
    esac
}
run() { local -a a; mapfile -t a < <(cmd "$1" "$2"); "${a[@]}"; }

echo "trace: bugfix-exact-match x$N = $BYTES bytes"
printf "%-44s %10s %10s\n" "mode" "seconds" "MB/s"
for m in ocsd_pkt ours_pkt ocsd_full ours_list ours_full; do
    s=$(best run $m "$DN")
    printf "%-44s %10.3f %10.1f\n" "$m" "$s" "$(echo "$BYTES / $s / 1000000" | bc -l)"
done

if [ "${CALLGRIND:-1}" != 0 ] && command -v valgrind >/dev/null; then
    ir() { # mode dir -> total Ir
        local out=$WORK/cg.$RANDOM
        local -a a; mapfile -t a < <(cmd "$1" "$2")
        valgrind --tool=callgrind --callgrind-out-file="$out" "${a[@]}" >/dev/null 2>&1 || true
        callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }'
    }
    echo
    ALL=$(stat -c %s "$D1/cstrace.bin")
    echo "callgrind: marginal instructions per trace byte = (Ir(1 MiB) - Ir(4 KiB)) / $ONE;"
    echo "whole process (start-up included) = Ir(1 MiB) / $ALL"
    printf "%-44s %14s %14s %10s %10s\n" "mode" "Ir(4KiB)" "Ir(1MiB)" "Ir/byte" "whole"
    for m in ocsd_pkt ours_pkt ocsd_full ours_list ours_full; do
        a=$(ir $m "$D0"); b=$(ir $m "$D1")
        printf "%-44s %14s %14s %10.2f %10.2f\n" "$m" "$a" "$b" "$(echo "($b - $a) / $ONE" | bc -l)" "$(echo "$b / $ALL" | bc -l)"
    done
fi
