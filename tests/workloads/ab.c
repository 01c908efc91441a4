/* A/B workload for `etm-bpf diff`: per iteration fa() runs UA units of the same loop, fb()
 * UB units and fc() one unit, so fa : fb : fc = UA : UB : 1 of the CPU time. Build A with
 * -DUA=2 -DUB=1, build B with -DUA=1 -DUB=2 (and -DPAD to move the code): fa's share drops
 * from 1/2 to 1/4, fb's rises from 1/4 to 1/2, fc's stays 1/4.
 * `ab SECONDS`: prints "ready PID", runs for SECONDS. A unit is long (~10 ms) next to the
 * sampling period (~1 ms), so periodic samples do not alias with the loop's period (short
 * units gave shares several binomial deviations off between runs).
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
__attribute__((noinline)) void fa(void) { for (int i = 0; i < UA; i++) unit(); }
__attribute__((noinline)) void fb(void) { for (int i = 0; i < UB; i++) unit(); }
__attribute__((noinline)) void fc(void) { unit(); }

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  double secs = argc > 1 ? atof(argv[1]) : 1e12;
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  double end = now() + secs;
  while (now() < end) {
    fa();
    fb();
    fc();
  }
  return 0;
}
