/* The test workloads' known ratios as shares of CPU time (included by ab.c and mixed.c;
 * chains.c takes its clock and random helpers only).
 *
 * A profiler samples CPU time, not calls; equal work is not equal time (on a 2-vCPU VM the
 * same loop ran ~20% slower called twice in a row than once, by rdtsc without any profiler),
 * so a workload that fixes its calls' counts does not know its own time shares. Each
 * workload's loop (`k = share_begin(&s); s.fn[k](); share_end(&s);`) calls whichever of its
 * functions is furthest behind its weight's share of this thread's CPU time
 * (CLOCK_THREAD_CPUTIME_ID: the kernel's per-thread CPU clock, the time cpu-clock sampling
 * samples), give or take a random jitter of up to two mean calls per function, so
 * that the sequence of calls has no period for a sampling timer to alias with (chains.c's two
 * paths paced by the clock without the jitter gave perf -F 999 a share of 0.73 and -F 1777
 * 0.40 of a true 0.67). The shares hold within a few calls at any moment. (chains.c does not
 * use this: paced by it, the arm64 kernel lab's stand-in windows under QEMU split its chains
 * 378 : 53, not 2 : 1, for reasons not yet known; it draws its calls at random instead.) */
#include <time.h>
#include <unistd.h>

#define SHARE_MAX 4

struct share {
  int n;
  void (*fn[SHARE_MAX])(void);
  double weight[SHARE_MAX];
  double spent[SHARE_MAX], total;
  unsigned long calls, rng;
  /* the call under way: its function, its start */
  int k;
  double t0;
};

static inline double share_clock(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A seed for `share_next` that differs between processes (never 0). */
static inline unsigned long share_seed(void) { return (unsigned long)getpid() * 0x9E3779B97F4A7C15UL | 1; }

/* The next of a xorshift sequence (`*rng` not 0). */
static inline unsigned long share_next(unsigned long *rng) {
  *rng ^= *rng << 13;
  *rng ^= *rng >> 7;
  *rng ^= *rng << 17;
  return *rng;
}

/* The next call: the index of the function furthest behind its share (with the jitter); the
 * caller calls it itself, so the function's caller on the stack is the caller's own frame
 * (main), then `share_end`. */
static inline int share_begin(struct share *s) {
  double weights = 0, mean = s->calls ? s->total / s->calls : 0, behind = -1e300;
  int k = 0;
  if (!s->rng) s->rng = share_seed();
  for (int i = 0; i < s->n; i++) weights += s->weight[i];
  for (int i = 0; i < s->n; i++) {
    double jitter = ((double)(share_next(&s->rng) >> 11) / (double)(1UL << 53) * 4.0 - 2.0) * mean;
    double d = s->weight[i] / weights * s->total - s->spent[i] + jitter;
    if (d > behind) {
      behind = d;
      k = i;
    }
  }
  s->k = k;
  s->t0 = share_clock(CLOCK_THREAD_CPUTIME_ID);
  return k;
}

/* The call `share_begin` chose returned: its CPU time to its function. */
static inline void share_end(struct share *s) {
  double dt = share_clock(CLOCK_THREAD_CPUTIME_ID) - s->t0;
  s->spent[s->k] += dt;
  s->total += dt;
  s->calls++;
}
