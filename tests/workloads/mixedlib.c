/* The library of tests/workloads/mixed.c, built the way distributions build libraries
 * (-O2, no frame pointers): lib_work -> lib_inner runs the same loop as mixed.c's spin.
 * Build: cc -O2 -g -fomit-frame-pointer -fno-optimize-sibling-calls -fPIC -shared
 *   -o libmixed.so mixedlib.c */
#define UNIT 100000UL
volatile unsigned long lib_sink;

__attribute__((noinline)) void lib_inner(void) {
  unsigned long x = 0;
  for (unsigned long i = 0; i < UNIT; i++) {
    x = x * 3 + i;
    __asm__ volatile("" : "+r"(x));
  }
  lib_sink = x;
}
void lib_work(void) { lib_inner(); }
