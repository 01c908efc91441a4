/* Calls through a function-pointer table (BLR) chosen by data. */
#include <stdio.h>
#include <stdlib.h>

typedef long (*op_fn)(long, long);

__attribute__((noinline)) static long op_add(long a, long b) { return a + b; }
__attribute__((noinline)) static long op_sub(long a, long b) { return a - b; }
__attribute__((noinline)) static long op_xor(long a, long b) { return a ^ (b << 1); }
__attribute__((noinline)) static long op_mix(long a, long b) {
    long r = a;
    for (int i = 0; i < (int)(b & 3); i++)
        r = r * 3 + i;
    return r;
}

static op_fn volatile table[4] = {op_add, op_sub, op_xor, op_mix};

__attribute__((noinline)) static long apply(unsigned k, long a, long b) { return table[k & 3](a, b); }

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 30000;
    unsigned x = 7;
    long acc = 1;
    for (int i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        acc = apply(x >> 28, acc, i) & 0xffffff;
    }
    printf("%ld\n", acc);
    return 0;
}
