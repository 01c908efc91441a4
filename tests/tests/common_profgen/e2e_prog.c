/* etm-bpf profgen end-to-end test program: work() is hot when called from caller_a (mode 1)
   and cold from caller_b (mode 0), so a context-sensitive profile should drive inlining of
   work into caller_a. Prints a checksum that optimized builds must reproduce. */
#include <stdio.h>
#include <stdlib.h>

/* Hot in one calling context (caller_a, mode 1), cold in the other (caller_b). */
static int table[64];

int work(int x, int mode) {
  int acc = 0;
  if (mode) {
    for (int i = 0; i < 24; i++)
      acc += table[(x + i) & 63] * (i + 1);
  } else {
    acc = table[x & 63] - x;
  }
  return acc;
}

int caller_a(int n) {
  int s = 0;
  for (int i = 0; i < n; i++)
    s += work(i, 1);
  return s;
}

int caller_b(int n) {
  int s = 0;
  for (int i = 0; i < n; i++)
    s ^= work(i, 0);
  return s;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 3000;
  for (int i = 0; i < 64; i++)
    table[i] = (i * 37) % 11;
  long total = 0;
  for (int r = 0; r < 4; r++) {
    total += caller_a(n);
    total += caller_b(n / 16);
  }
  printf("%ld\n", total);
  return 0;
}
