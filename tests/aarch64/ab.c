/* A/B builds for `etm-bpf diff` on exact counts: per iteration fa() runs UA units of its own
 * loop, fb() UB units and fc() one unit (each function executes its own instructions), so
 * their instruction shares are about UA : UB : 1. Build A: -DUA=2 -DUB=1, build B: -DUA=1
 * -DUB=2. */
#include <stdio.h>
#include <stdlib.h>

#ifndef UA
#define UA 2
#endif
#ifndef UB
#define UB 1
#endif
volatile unsigned long sink;

/* Distinct constants: identical bodies would be folded into one (gcc -fipa-icf at -O2), and
 * two names at one address make the attribution a matter of which name is chosen. */
#define LOOP(n, k) for (unsigned long i = 0; i < 200UL * (n); i++) sink += i * (k)
__attribute__((noinline)) static void fa(void) { LOOP(UA, 3); }
__attribute__((noinline)) static void fb(void) { LOOP(UB, 5); }
__attribute__((noinline)) static void fc(void) { LOOP(1, 7); }

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 400;
    for (int i = 0; i < n; i++) {
        fa();
        fb();
        fc();
    }
    printf("%lu\n", sink);
    return 0;
}
