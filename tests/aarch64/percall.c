/* A/B builds for `etm-bpf diff` on instructions per call: shared() is called by two callers,
 * left() once and right() twice per round. Build A runs PAD extra instructions in shared() on
 * every call (a stand-in for an LL/SC retry loop that build B replaced by a single atomic);
 * build B has -DPAD=0: B removes exactly PAD instructions per call of shared(), nothing else.
 * noipa: no clones, no inlining, no interprocedural shortcuts between the functions. */
#include <stdio.h>
#include <stdlib.h>

#ifndef PAD
#define PAD 6
#endif
#define STR2(x) #x
#define STR(x) STR2(x)
volatile unsigned long sink;

__attribute__((noipa)) static unsigned long shared(unsigned long x) {
    __asm__ volatile(".rept " STR(PAD) "\n\tnop\n\t.endr");
    return (x * 2654435761UL) ^ (x >> 7);
}

__attribute__((noipa)) static unsigned long left(unsigned long x) {
    unsigned long r = shared(x + 1);
    sink += r;
    return r + 3;
}

__attribute__((noipa)) static unsigned long right(unsigned long x) {
    unsigned long r = shared(x) + shared(x ^ 0x55);
    sink ^= r;
    return r - 1;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 20000;
    unsigned long acc = 1;
    for (int i = 0; i < n; i++) {
        acc = left(acc) + (unsigned long)(i & 7);
        acc = right(acc);
    }
    printf("%lu\n", acc);
    return 0;
}
