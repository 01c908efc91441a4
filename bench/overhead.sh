#!/usr/bin/env bash
# Overhead of `etm-bpf run` next to `perf record -g` at the same frequency, on the same
# fixed-work workload (tests/workloads/chains.c: ITERS iterations of (main->a->hot1) x2 +
# main->b->hot2), in one run. Reports, as medians over REPS runs:
#   * workload slowdown: CPU time (user + sys, which includes the sampling interrupts and the
#     eBPF program / perf's in-kernel unwinding charged to the workload) of the fixed work vs.
#     an unprofiled baseline; wall time is printed too but is noisy on a loaded machine;
#   * the profiler's own CPU time (user + sys of the etm-bpf / perf record process);
#   * ratios etm-bpf / perf record.
# Both profilers attach to the running workload by pid during its 1 s start-up sleep, and
# both stop when it exits (etm-bpf writes its final dump; perf writes perf.data).
# Usage (root): bench/overhead.sh    env: FREQ (999) ITERS (10000) REPS (3) ETM_BPF_BIN
set -euo pipefail
cd "$(dirname "$0")/.."
FREQ=${FREQ:-999}
ITERS=${ITERS:-10000}
REPS=${REPS:-3}
BIN=${ETM_BPF_BIN:-${CARGO_TARGET_DIR:-target}/release/etm-bpf}
[ -x "$BIN" ] || cargo build --release --locked -p etm-bpf
command -v perf >/dev/null || { echo "overhead.sh: perf not found (apt-get install linux-perf)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc=$(command -v clang-22 || command -v clang || command -v gcc)
"$cc" -O1 -g -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer -fno-optimize-sibling-calls \
  -pthread -o "$tmp/chains" tests/workloads/chains.c

# run_one MODE -> prints "elapsed_s workload_cpu_s profiler_cpu_s"
run_one() {
  local mode=$1
  "$tmp/chains" 0 "$ITERS" 1000 >"$tmp/ready" 2>"$tmp/elapsed" &
  local wpid=$!
  local ppid=""
  : >"$tmp/cpu"
  case "$mode" in
    etm-bpf)
      ( TIMEFORMAT='%U %S'; { time "$BIN" run --pid "$wpid" --headless --freq "$FREQ" \
          --dump-dir "$tmp/dump" >/dev/null 2>"$tmp/prof.err"; } 2>"$tmp/cpu" ) &
      ppid=$! ;;
    perf)
      ( TIMEFORMAT='%U %S'; { time perf record -q -F "$FREQ" -g -p "$wpid" -o "$tmp/perf.data" \
          >/dev/null 2>"$tmp/prof.err"; } 2>"$tmp/cpu" ) &
      ppid=$! ;;
  esac
  wait "$wpid"
  [ -n "$ppid" ] && wait "$ppid"
  local el wcpu cpu
  el=$(awk '/^elapsed/ {print $2}' "$tmp/elapsed")
  wcpu=$(awk '/^elapsed/ {print $4}' "$tmp/elapsed")
  cpu=$(awk 'NF==2 {print $1+$2}' "$tmp/cpu")
  echo "$el $wcpu ${cpu:-0}"
}

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

declare -A EL WCPU CPU
for mode in baseline etm-bpf perf; do
  : >"$tmp/$mode.el"; : >"$tmp/$mode.wcpu"; : >"$tmp/$mode.cpu"
done
for r in $(seq "$REPS"); do
  for mode in baseline etm-bpf perf; do   # interleaved, so background load hits all alike
    read -r el wcpu cpu < <(run_one "$mode")
    echo "$el" >>"$tmp/$mode.el"; echo "$wcpu" >>"$tmp/$mode.wcpu"; echo "$cpu" >>"$tmp/$mode.cpu"
    echo "rep $r $mode: elapsed ${el}s workload cpu ${wcpu}s profiler cpu ${cpu}s" >&2
  done
done
for mode in baseline etm-bpf perf; do
  EL[$mode]=$(median <"$tmp/$mode.el"); WCPU[$mode]=$(median <"$tmp/$mode.wcpu")
  CPU[$mode]=$(median <"$tmp/$mode.cpu")
done
samples=$(grep -o '"samples": [0-9]*' "$tmp/dump/manifest.json" | head -1 | awk '{print $2}')
awk -v b="${WCPU[baseline]}" -v e="${WCPU[etm-bpf]}" -v p="${WCPU[perf]}" \
    -v bw="${EL[baseline]}" -v ew="${EL[etm-bpf]}" -v pw="${EL[perf]}" \
    -v ce="${CPU[etm-bpf]}" -v cp="${CPU[perf]}" -v f="$FREQ" -v n="$ITERS" -v r="$REPS" -v s="$samples" '
BEGIN {
  se = 100 * (e / b - 1); sp = 100 * (p / b - 1)
  printf "overhead at %d Hz, %d iterations, median of %d runs (etm-bpf last run: %s samples)\n", f, n, r, s
  printf "%-14s %13s %10s %10s %14s\n", "", "workload cpu", "slowdown", "wall s", "profiler cpu s"
  printf "%-14s %13.3f %10s %10.3f %14s\n", "baseline", b, "-", bw, "-"
  printf "%-14s %13.3f %9.1f%% %10.3f %14.3f\n", "etm-bpf run", e, se, ew, ce
  printf "%-14s %13.3f %9.1f%% %10.3f %14.3f\n", "perf record -g", p, sp, pw, cp
  printf "ratio etm-bpf/perf: slowdown %s, profiler cpu %s\n", \
    (sp > 0 ? sprintf("%.2f", se / sp) : "n/a (perf slowdown <= 0)"), (cp > 0 ? sprintf("%.2f", ce / cp) : "n/a")
}'
