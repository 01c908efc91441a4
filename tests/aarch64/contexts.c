/* A stationary mixture of calling contexts with fixed instruction shares, for checking sampled
 * profiles against the exact executed path (the kernel lab runs it under `etm-bpf run` in an
 * arm64 guest; qemu-user gives the truth of the same program).
 *
 *   main -> work -> alpha                 (a counted loop)
 *   main -> work -> beta -> gamma         (beta calls gamma in a loop)
 *   main -> work -> delta                 (through a function pointer)
 *
 * Every iteration of work() executes the same instructions, so the shares do not depend on
 * when sampling starts or on the iteration count.
 * argv[1]: iterations (default 1000); argv[2]: milliseconds to sleep first (default 0), so a
 * profiler can attach to the pid before the work starts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;

__attribute__((noinline)) unsigned long alpha(unsigned long x) {
    for (int i = 0; i < 3000; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
    return x;
}

__attribute__((noinline)) unsigned long gamma_(unsigned long x) {
    for (int i = 0; i < 150; i++) x ^= (x << 7) ^ (x >> 9);
    return x;
}

__attribute__((noinline)) unsigned long beta(unsigned long x) {
    for (int i = 0; i < 40; i++) x = gamma_(x + i);
    return x;
}

__attribute__((noinline)) unsigned long delta(unsigned long x) {
    for (int i = 0; i < 1000; i++) x += (x >> 3) | (unsigned long)i;
    return x;
}

unsigned long (*volatile indirect)(unsigned long) = delta;

__attribute__((noinline)) unsigned long work(unsigned long x) {
    x = alpha(x);
    x = beta(x);
    x = indirect(x);
    sink = x; /* not a tail call: work stays on the stack */
    return x;
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 1000;
    long delay_ms = argc > 2 ? atol(argv[2]) : 0;
    if (delay_ms > 0) {
        struct timespec ts = {delay_ms / 1000, (delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    unsigned long x = 1;
    for (long i = 0; i < iters; i++) x = work(x);
    sink = x;
    printf("%lu\n", x);
    return 0;
}
