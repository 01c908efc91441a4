/* Workload mixing a frame-pointer executable with a shared library built without frame
 * pointers (tests/workloads/mixedlib.c), for `run --unwind auto`'s per-binary rule.
 * main calls fa() -> lib_work -> lib_inner (in the library) and fb() -> spin (here), the same
 * loop of UNIT iterations, to hold them at 1 : 1 of its CPU time (share.h), so each path gets
 * half. (The loop is a register-only chain because one through a volatile variable ran 2.3x
 * slower in the library, addressed through its GOT, than in the executable.)
 * `mixed SECONDS`: prints "ready PID", runs for SECONDS.
 * Build (the same -O2 as the library, so the two loops are the same code): cc -O2 -g
 *   -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer
 *   -fno-optimize-sibling-calls mixed.c -L. -lmixed -Wl,-rpath,<dir of libmixed.so> */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "share.h"

#define UNIT 100000UL
void lib_work(void);
volatile unsigned long sink;

/* A register-only dependency chain (the same in mixedlib.c): its speed does not depend on
 * how each binary addresses its data. */
__attribute__((noinline)) void spin(void) {
  unsigned long x = 0;
  for (unsigned long i = 0; i < UNIT; i++) {
    x = x * 3 + i;
    __asm__ volatile("" : "+r"(x));
  }
  sink = x;
}
__attribute__((noinline)) void fa(void) { lib_work(); }
__attribute__((noinline)) void fb(void) { spin(); }

int main(int argc, char **argv) {
  double end = share_clock(CLOCK_MONOTONIC) + (argc > 1 ? atof(argv[1]) : 1e12);
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  struct share s = {.n = 2, .fn = {fa, fb}, .weight = {1, 1}};
  while (share_clock(CLOCK_MONOTONIC) < end) {
    int k = share_begin(&s);
    s.fn[k]();
    share_end(&s);
  }
  return 0;
}
