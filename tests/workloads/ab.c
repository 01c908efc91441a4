/* A/B workload for `etm-bpf diff` and the multi-process tests: fa(), fb() and fc() each run
 * one unit of the same loop, and the main loop calls whichever is furthest behind its target
 * share of this thread's CPU time, measured with CLOCK_THREAD_CPUTIME_ID (the kernel's
 * per-thread CPU clock, the time cpu-clock sampling samples), so fa : fb : fc = UA : UB : 1 of
 * the CPU spent in the three, within one unit at any moment. Build A with -DUA=2 -DUB=1,
 * build B with -DUA=1 -DUB=2 (and -DPAD to move the code): fa's share drops from 1/2 to 1/4,
 * fb's rises from 1/4 to 1/2, fc's stays 1/4.
 * (Equal work is not equal time: on a 2-vCPU VM the same loop's units ran ~20% slower
 * called twice in a row from fa than once from fb or fc, by rdtsc without any profiler, so
 * fixed unit counts gave fa 0.55-0.57 of the time, not 1/2.)
 * `ab SECONDS`: prints "ready PID", runs for SECONDS. A unit is long (~10 ms) next to the
 * sampling period (~1 ms), so periodic samples do not alias with the loop's period (short
 * units gave shares several binomial deviations off between runs); the two clock reads per
 * unit are ~1 us.
 * Build: cc -O1 -g -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer -DUA=.. -DUB=.. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

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

static double clock_s(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  double secs = argc > 1 ? atof(argv[1]) : 1e12;
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  void (*const fn[3])(void) = {fa, fb, fc};
  const double weight[3] = {UA, UB, 1};
  const double weights = UA + UB + 1;
  double spent[3] = {0, 0, 0}, total = 0;
  double end = clock_s(CLOCK_MONOTONIC) + secs;
  while (clock_s(CLOCK_MONOTONIC) < end) {
    /* the function furthest behind its share (the first of equals) */
    int k = 0;
    double behind = -1e300;
    for (int i = 0; i < 3; i++) {
      double d = weight[i] / weights * total - spent[i];
      if (d > behind) {
        behind = d;
        k = i;
      }
    }
    double t0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    fn[k]();
    double t = clock_s(CLOCK_THREAD_CPUTIME_ID) - t0;
    spent[k] += t;
    total += t;
  }
  return 0;
}
