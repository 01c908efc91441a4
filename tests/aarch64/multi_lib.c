/* Second compilation unit of the multi-module program ("library"), in section fartext. */
#define FAR __attribute__((noinline, section("fartext")))

FAR static long mix(long v, int k) { return (v ^ (v >> 7)) * (2 * k + 1); }

FAR long lib_hash(const unsigned char *p, int n) {
    long h = 1469598103;
    for (int i = 0; i < n; i++)
        h = (h ^ p[i]) * 16777619;
    return h & 0xffffff;
}

FAR long lib_dispatch(int k, long v) {
    if (k % 3 == 0)
        return mix(v, k);
    if (k % 3 == 1)
        return mix(v + 1, k + 1) - 1;
    return v;
}
