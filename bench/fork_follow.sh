#!/usr/bin/env bash
# Cost of `run --follow-children` to the forks of other processes: the task:task_newtask
# program runs in every fork on the machine (a hash lookup of the parent, a miss for
# processes outside the profile). A loop of N fork() + _exit() + waitpid() is timed
# (CPU time of the loop and its children, getrusage; wall time too) without etm-bpf, with
# `etm-bpf run --pid SLEEPER` and with `etm-bpf run --pid SLEEPER --follow-children` attached
# (SLEEPER: a sleeping process, so the loop's forks are not followed; the difference of the
# last two is the fork program's, both pay the per-CPU sampling interrupts), interleaved,
# median of REPS runs.
# Usage (root): bench/fork_follow.sh    env: FORKS (20000) REPS (5) ETM_BPF_BIN
set -euo pipefail
cd "$(dirname "$0")/.."
FORKS=${FORKS:-20000}
REPS=${REPS:-5}
BIN=${ETM_BPF_BIN:-${CARGO_TARGET_DIR:-target}/release/etm-bpf}
[ -x "$BIN" ] || cargo build --release --locked -p etm-bpf
tmp=$(mktemp -d)
sleep 1000 &
sleeper=$!
trap 'kill $sleeper 2>/dev/null; rm -rf "$tmp"' EXIT
cat >"$tmp/forks.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
  long n = atol(argv[1]);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0; i < n; i++) {
    pid_t p = fork();
    if (p == 0) _exit(0);
    waitpid(p, NULL, 0);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  struct rusage s, c;
  getrusage(RUSAGE_SELF, &s);
  getrusage(RUSAGE_CHILDREN, &c);
  double cpu = s.ru_utime.tv_sec + s.ru_stime.tv_sec + c.ru_utime.tv_sec + c.ru_stime.tv_sec +
               (s.ru_utime.tv_usec + s.ru_stime.tv_usec + c.ru_utime.tv_usec + c.ru_stime.tv_usec) * 1e-6;
  double wall = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
  printf("%.3f %.3f\n", wall / n * 1e6, cpu / n * 1e6);
  return 0;
}
C
cc=$(command -v clang-22 || command -v clang || command -v gcc)
"$cc" -O2 -o "$tmp/forks" "$tmp/forks.c"

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
: >"$tmp/off"
: >"$tmp/pid"
: >"$tmp/follow"
profiled() { # MODE ARGS...: the loop with etm-bpf run ARGS attached
  local mode=$1
  shift
  "$BIN" run --pid "$sleeper" "$@" --headless --dump-dir "$tmp/dump" >"$tmp/run.out" 2>&1 &
  local prof=$!
  # Attached once the first status line is out.
  for _ in $(seq 100); do grep -q "^etm-bpf:" "$tmp/run.out" && break; sleep 0.1; done
  "$tmp/forks" "$FORKS" >>"$tmp/$mode"
  kill -INT $prof
  wait $prof || true
}
for _ in $(seq "$REPS"); do
  "$tmp/forks" "$FORKS" >>"$tmp/off"
  profiled pid
  profiled follow --follow-children
done
for mode in off pid follow; do
  printf "%-40s wall %s us/fork  cpu %s us/fork\n" "$mode" \
    "$(cut -d' ' -f1 "$tmp/$mode" | median)" "$(cut -d' ' -f2 "$tmp/$mode" | median)"
done
