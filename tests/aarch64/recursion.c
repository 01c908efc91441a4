/* Non-tail recursion (fib, tree depth), so call stacks get deep. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) static long fib(int n) {
    if (n < 2)
        return n;
    return fib(n - 1) + fib(n - 2);
}

struct node { struct node *l, *r; int v; };
static struct node pool[4096];
static int used;

__attribute__((noinline)) static struct node *build(int depth, int v) {
    if (depth <= 0 || used >= 4096)
        return 0;
    struct node *n = &pool[used++];
    n->v = v;
    n->l = build(depth - 1, v * 2);
    n->r = (v % 3) ? build(depth - 2, v * 2 + 1) : 0;
    return n;
}

__attribute__((noinline)) static int depth(const struct node *n) {
    if (!n)
        return 0;
    int a = depth(n->l), b = depth(n->r);
    return 1 + (a > b ? a : b);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 18;
    struct node *root = build(10, 1);
    long s = 0;
    for (int i = 0; i < 3; i++)
        s += depth(root);
    printf("%ld %ld\n", fib(n), s);
    return 0;
}
