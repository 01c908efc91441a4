/* Workload whose distinctive work happens only at start-up, for `etm-bpf run -- CMD`.
 *
 *   startup BOOT_MS STEADY_MS EXIT
 *
 * First main->boot->boot_hot->spin until the main thread used BOOT_MS of CPU time (start-up:
 * only a profiler in place before the exec sees it), then main->steady->steady_hot->spin for
 * STEADY_MS more. Both paths run the same spin() loop, so their sample shares are
 * BOOT_MS : STEADY_MS. Then it prints one line to stdout,
 *   "startup uid=U gid=G groups=G1,G2,... boot_ms=B steady_ms=S"
 * (its real ids, from getuid/getgid/getgroups), and exits with status EXIT, or, if EXIT is
 * negative, kills itself with signal -EXIT.
 * Build: clang -O1 -g -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define UNIT 20000UL
volatile unsigned long sink;

__attribute__((noinline)) void spin(void) {
  for (unsigned long i = 0; i < UNIT; i++) sink += i * 3;
}

static double cpu_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

__attribute__((noinline)) void boot_hot(void) { spin(); }
__attribute__((noinline)) void steady_hot(void) { spin(); }

__attribute__((noinline)) void boot(double until_ms) {
  while (cpu_ms() < until_ms) boot_hot();
}
__attribute__((noinline)) void steady(double until_ms) {
  while (cpu_ms() < until_ms) steady_hot();
}

int main(int argc, char **argv) {
  double boot_ms = argc > 1 ? atof(argv[1]) : 200;
  double steady_ms = argc > 2 ? atof(argv[2]) : 600;
  int code = argc > 3 ? atoi(argv[3]) : 0;
  boot(cpu_ms() + boot_ms);
  steady(cpu_ms() + steady_ms);
  gid_t groups[256];
  int n = getgroups(256, groups);
  printf("startup uid=%u gid=%u groups=", (unsigned)getuid(), (unsigned)getgid());
  for (int i = 0; i < n; i++) printf("%s%u", i ? "," : "", (unsigned)groups[i]);
  printf(" boot_ms=%g steady_ms=%g\n", boot_ms, steady_ms);
  fflush(stdout);
  if (code < 0) {
    signal(-code, SIG_DFL);
    raise(-code);
  }
  return code;
}
