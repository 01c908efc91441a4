/* A 20-case switch: both gcc and clang emit a jump table (BR through a table). */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) static long step(unsigned op, long v) {
    switch (op) {
    case 0: return v + 1;
    case 1: return v * 3;
    case 2: return v - 7;
    case 3: return v ^ 0x55;
    case 4: return v << 1;
    case 5: return v >> 1;
    case 6: return v + 100;
    case 7: return v * 5 + 1;
    case 8: return ~v;
    case 9: return v | 0x100;
    case 10: return v & 0xffff;
    case 11: return v - 1000;
    case 12: return v * 7;
    case 13: return v + (v >> 3);
    case 14: return v ^ (v << 2);
    case 15: return v + 13;
    case 16: return v * 11;
    case 17: return v - 3;
    case 18: return v ^ 0xabc;
    case 19: return v + 99;
    default: return v;
    }
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 20000;
    unsigned x = 99;
    long v = 0;
    for (int i = 0; i < n; i++) {
        x = x * 22695477u + 1u;
        v = step((x >> 16) % 21, v) & 0xfffffff;
    }
    printf("%ld\n", v);
    return 0;
}
