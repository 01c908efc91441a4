/* Workload with a deep stack of known shape for the DWARF unwinding test (run_unwind.rs):
 * main -> rec x (DEPTH + 1) -> spin, each rec frame holding a 256-byte buffer, so the stack
 * from spin's frame up to main is more than DEPTH * 256 bytes (~15 KiB at DEPTH 60).
 * Prints "ready <pid>" once running. Stops after argv[1] seconds (default: never).
 * Build: -O2 -fomit-frame-pointer -fno-optimize-sibling-calls
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define DEPTH 60
volatile unsigned long sink;
static double end_time;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

__attribute__((noinline)) void spin(void) {
  while (now() < end_time)
    for (unsigned long i = 0; i < 1000000UL; i++) sink += i;
}

__attribute__((noinline)) void rec(int n) {
  volatile char buf[256];
  for (int i = 0; i < 256; i++) buf[i] = (char)(n + i);
  if (n > 0)
    rec(n - 1);
  else
    spin();
  sink += buf[n & 255];
}

int main(int argc, char **argv) {
  end_time = now() + (argc > 1 ? atof(argv[1]) : 1e12);
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  rec(DEPTH);
  return 0;
}
