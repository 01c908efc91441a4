/* Workload mixing a frame-pointer executable with a shared library built without frame
 * pointers (tests/workloads/mixedlib.c), for `run --unwind auto`'s per-binary rule.
 * Per iteration main calls fa() and fb(): fa -> lib_work -> lib_inner (in the library) and
 * fb -> spin (here) run the same loop of UNIT iterations, so each path gets half the CPU
 * (a loop through a volatile variable ran 2.3x slower in the library, addressed through its
 * GOT, than in the executable: perf showed 30% : 70%).
 * `mixed SECONDS`: prints "ready PID", runs for SECONDS.
 * Build (the same -O2 as the library, so the two loops are the same code): cc -O2 -g
 *   -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer
 *   -fno-optimize-sibling-calls mixed.c -L. -lmixed -Wl,-rpath,<dir of libmixed.so> */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

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

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  double end = now() + (argc > 1 ? atof(argv[1]) : 1e12);
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  while (now() < end) {
    fa();
    fb();
  }
  return 0;
}
