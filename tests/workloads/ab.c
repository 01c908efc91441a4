/* A/B workload for `etm-bpf diff` and the multi-process tests: fa(), fb() and fc() each run
 * one unit of the same loop, and the main loop calls them to hold fa : fb : fc = UA : UB : 1
 * of this thread's CPU time (share.h). Build A with -DUA=2 -DUB=1, build B with -DUA=1
 * -DUB=2 (and -DPAD to move the code): fa's share drops from 1/2 to 1/4, fb's rises from 1/4
 * to 1/2, fc's stays 1/4. (With fixed unit counts, fa running two in a row, fa had 0.55-0.57
 * of the time by rdtsc without any profiler, not 1/2.)
 * `ab SECONDS`: prints "ready PID", runs for SECONDS. A unit is long (~10 ms) next to the
 * sampling period (~1 ms), so periodic samples do not alias with the loop's period (short
 * units gave shares several binomial deviations off between runs); the two clock reads per
 * unit are ~1 us.
 * Build: cc -O1 -g -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer -DUA=.. -DUB=.. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "share.h"

#ifndef UA
#define UA 2
#endif
#ifndef UB
#define UB 1
#endif
#define UNIT 3000000UL
volatile unsigned long sink;

#ifdef PAD
__attribute__((noinline)) void pad(void) { sink += 7; }
#endif
__attribute__((noinline)) void unit(void) {
  for (unsigned long i = 0; i < UNIT; i++) sink += i * 3;
}
__attribute__((noinline)) void fa(void) { unit(); }
__attribute__((noinline)) void fb(void) { unit(); }
__attribute__((noinline)) void fc(void) { unit(); }

int main(int argc, char **argv) {
  double secs = argc > 1 ? atof(argv[1]) : 1e12;
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  struct share s = {.n = 3, .fn = {fa, fb, fc}, .weight = {UA, UB, 1}};
  double end = share_clock(CLOCK_MONOTONIC) + secs;
  while (share_clock(CLOCK_MONOTONIC) < end) {
    int k = share_begin(&s);
    s.fn[k]();
    share_end(&s);
  }
  return 0;
}
