/* Calls of varying length, for the coverage of the per-call intervals: 16 leaf functions
 * whose loops run a pseudo-random number of rounds on every call (1 to 4 + 3i for leaf i:
 * a different length per call), and 4 callers that run their own loop of varying length and
 * call two leaves each. main calls them through a table in a pseudo-random order. noipa: no
 * clones, no inlining. */
#include <stdio.h>
#include <stdlib.h>

typedef unsigned (*fn_t)(unsigned);

#define LEAF(i)                                                               \
    __attribute__((noipa)) static unsigned v##i(unsigned x) {                 \
        unsigned rounds = ((x >> 11) % (4u + 3u * (i))) + 1u;                 \
        for (unsigned k = 0; k < rounds; k++) x = (x ^ (x >> 3)) * 2654435761u; \
        return x;                                                             \
    }
LEAF(0) LEAF(1) LEAF(2) LEAF(3) LEAF(4) LEAF(5) LEAF(6) LEAF(7)
LEAF(8) LEAF(9) LEAF(10) LEAF(11) LEAF(12) LEAF(13) LEAF(14) LEAF(15)

#define MID(i, a, b)                                                          \
    __attribute__((noipa)) static unsigned m##i(unsigned x) {                 \
        unsigned rounds = ((x >> 7) % 9u) + 1u;                               \
        for (unsigned k = 0; k < rounds; k++) x = x * 31u + (i);              \
        x = v##a(x + 1u);                                                     \
        return v##b(x ^ 0x55u) + (i);                                         \
    }
MID(0, 1, 6) MID(1, 3, 12) MID(2, 5, 9) MID(3, 14, 0)

static fn_t volatile table[20] = {v0, v1, v2,  v3,  v4,  v5,  v6, v7, v8, v9,
                                  v10, v11, v12, v13, v14, v15, m0, m1, m2, m3};

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 10000;
    unsigned x = 12345, acc = 0;
    for (int i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        acc ^= table[(x >> 16) % 20u](acc + x);
    }
    printf("%u\n", acc);
    return 0;
}
