/* Main compilation unit of the multi-module program; calls into multi_lib.c, whose code is
 * placed in its own section (fartext) far away from .text. */
#include <stdio.h>
#include <stdlib.h>

long lib_hash(const unsigned char *p, int n);
long lib_dispatch(int k, long v);

__attribute__((noinline)) static long local_work(long v) {
    for (int i = 0; i < 5; i++)
        v = v * 31 + i;
    return v;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 3000;
    unsigned char buf[64];
    for (int i = 0; i < 64; i++)
        buf[i] = (unsigned char)(i * 7);
    long acc = 0;
    for (int i = 0; i < n; i++) {
        buf[i & 63] ^= (unsigned char)acc;
        acc += lib_hash(buf, 16 + (i & 15));
        acc = lib_dispatch(i, acc) + local_work(acc & 0xff);
        acc &= 0xfffffff;
    }
    printf("%ld\n", acc);
    return 0;
}
