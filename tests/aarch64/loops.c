/* Counted and nested loops with data-dependent conditional branches. */
#include <stdio.h>
#include <stdlib.h>

#define N 2000

static int data[N];

__attribute__((noinline)) static long sum_odd(const int *v, int n) {
    long s = 0;
    for (int i = 0; i < n; i++)
        if (v[i] & 1)
            s += v[i];
    return s;
}

__attribute__((noinline)) static long nested(int n) {
    long s = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i % 7; j++)
            s += (i ^ j) & 3;
    return s;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 40;
    unsigned x = 12345;
    for (int i = 0; i < N; i++) {
        x = x * 1103515245u + 12345u;
        data[i] = (int)(x >> 16);
    }
    long total = 0;
    for (int r = 0; r < rounds; r++) {
        total += sum_odd(data, N);
        total += nested(200 + r);
    }
    printf("%ld\n", total);
    return 0;
}
