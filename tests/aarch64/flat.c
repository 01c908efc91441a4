/* A flat workload: 256 small functions, each a short loop of its own length (1-8 rounds),
 * called in a pseudo-random order through a table, so the cost is spread thin over many
 * functions with no hot spot (the case where sampled profiles see few of them). */
#include <stdio.h>
#include <stdlib.h>

typedef unsigned (*fn_t)(unsigned);

#define F(i)                                                                  \
    __attribute__((noinline)) static unsigned f##i(unsigned x) {              \
        for (unsigned k = 0; k < ((i) * 7u % 8u) + 1u; k++) x = x * 31u + (i); \
        return x;                                                             \
    }
#define F4(i) F(i##0) F(i##1) F(i##2) F(i##3)
#define F16(i) F4(i##0) F4(i##1) F4(i##2) F4(i##3)
#define F64(i) F16(i##0) F16(i##1) F16(i##2) F16(i##3)
F64(1) F64(2) F64(3) F64(4)

#define R(i) f##i,
#define R4(i) R(i##0) R(i##1) R(i##2) R(i##3)
#define R16(i) R4(i##0) R4(i##1) R4(i##2) R4(i##3)
#define R64(i) R16(i##0) R16(i##1) R16(i##2) R16(i##3)
static fn_t volatile table[256] = {R64(1) R64(2) R64(3) R64(4)};

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 40000;
    unsigned x = 12345, acc = 0;
    for (int i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        acc ^= table[(x >> 16) & 255](acc + (unsigned)i);
    }
    printf("%u\n", acc);
    return 0;
}
