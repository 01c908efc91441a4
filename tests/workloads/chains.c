/* Workload with known hot call chains for the end-to-end test of `etm-bpf run`.
 *
 * Main thread: a() calls hot1() once, b() calls hot2() once; each hot call runs spin() (one
 * loop of UNIT iterations, the same code for all), and the main loop calls a() with
 * probability 2/3 and b() with 1/3, drawn at random so that the calls have no period for a
 * sampling timer to alias with and neither path runs in fixed pairs: main->a->hot1->spin
 * gets 2/3 and main->b->hot2->spin 1/3 of the main thread's CPU time. (A fixed a(); b(); loop
 * with a() calling hot1() twice gave hot1 0.68-0.72 by perf alone; pacing the calls by the
 * thread's CPU clock, as tests/workloads/share.h does, split them 378 : 53 in the arm64
 * kernel lab's stand-in under QEMU, so this loop reads no clock per call.) On SIGUSR1 the workload starts a new thread running
 * worker->c->hot3->spin forever (a thread created after profiling started).
 * Prints "ready <pid>" once running. Stops after argv[1] seconds (default: never).
 * Benchmark mode (bench/overhead.sh): `chains 0 ITERS DELAY_MS` sleeps DELAY_MS, runs exactly
 * ITERS iterations of a(); a(); b(); and prints "elapsed <wall seconds> cpu <process CPU seconds>" to stderr.
 * Build: clang -O1 -g -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer -pthread
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "share.h"

#define UNIT 100000UL
volatile unsigned long sink;

/* One loop shared by all hot paths: the same machine code, so CPU time is proportional to
 * the number of calls. */
__attribute__((noinline)) void spin(void) {
  for (unsigned long i = 0; i < UNIT; i++) sink += i * 3;
}
__attribute__((noinline)) void hot1(void) { spin(); }
__attribute__((noinline)) void hot2(void) { spin(); }
__attribute__((noinline)) void hot3(void) { spin(); }
__attribute__((noinline)) void a(void) { hot1(); }
__attribute__((noinline)) void b(void) { hot2(); }
__attribute__((noinline)) void c(void) { hot3(); }

__attribute__((noinline)) void *worker(void *arg) {
  (void)arg;
  for (;;) c();
  return NULL;
}

static volatile sig_atomic_t spawn;
static void on_usr1(int sig) { (void)sig; spawn = 1; }

int main(int argc, char **argv) {
  double secs = argc > 1 ? atof(argv[1]) : 1e12;
  long iters = argc > 2 ? atol(argv[2]) : 0;
  signal(SIGUSR1, on_usr1);
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  if (iters > 0) {
    usleep((useconds_t)(argc > 3 ? atol(argv[3]) : 0) * 1000);
    double t0 = share_clock(CLOCK_MONOTONIC), c0 = share_clock(CLOCK_PROCESS_CPUTIME_ID);
    for (long i = 0; i < iters; i++) {
      a();
      a();
      b();
    }
    fprintf(stderr, "elapsed %.6f cpu %.6f\n", share_clock(CLOCK_MONOTONIC) - t0, share_clock(CLOCK_PROCESS_CPUTIME_ID) - c0);
    return 0;
  }
  unsigned long rng = share_seed();
  double end = share_clock(CLOCK_MONOTONIC) + secs;
  while (share_clock(CLOCK_MONOTONIC) < end) {
    if (share_next(&rng) % 3)
      a();
    else
      b();
    if (spawn == 1) {
      pthread_t t;
      spawn = 2;
      pthread_create(&t, NULL, worker, NULL);
    }
  }
  return 0;
}
