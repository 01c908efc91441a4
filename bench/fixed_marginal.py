#!/usr/bin/env python3
"""A trace window's cost as a fixed part per window and a part per traced instruction.

    bench/fixed_marginal.py DIR_1K DIR_10K [N]

DIR_1K and DIR_10K are work directories that `KEEP=1 bench/pipeline_window.sh` left for the
same program and options at WINDOW=1000 and WINDOW=10000 (`bench/fixed_marginal.sh` makes
both). Each holds callgrind outputs of `etm-bpf replay` of a short and a long session; the
marginal inclusive cost per window of each function at both window lengths gives, solved as
cost = F + m x (traced instructions in the window), its fixed part F per window and its part m
per traced instruction. Prints `Pipeline::push_aux`'s, then the N (default 25) functions
of the project's under it with the largest inclusive cost per 1,000-instruction window.
(Inclusive: a function's F and m contain its callees', so the rows overlap; code inlined
into a caller is the caller's, so a function inlined in some places shows only the rest, and
its F and m can come out negative.)
"""
import glob
import os
import re
import sys


def inclusive(path):
    """Inclusive instructions by function from a callgrind output: its own, and each call's
    from it (the cost line after `calls=`; a function's calls to itself left out)."""
    names, cost = {}, {}
    fn = cfn = None
    in_call = False

    def name(line):
        m = re.match(r"c?fn=\((\d+)\)(?: (.*))?", line)
        if m.group(2):
            names[m.group(1)] = m.group(2)
        return names[m.group(1)]

    for line in open(path):
        line = line.rstrip("\n")
        if line.startswith("fn="):
            fn = name(line)
        elif line.startswith("cfn="):
            cfn = name(line)
        elif line.startswith("calls="):
            in_call = True
        elif line and (line[0].isdigit() or line[0] in "+-*") and fn is not None:
            ir = int(line.split()[-1])
            if not in_call or cfn != fn:
                cost[fn] = cost.get(fn, 0) + ir
            in_call = False
    return cost


def per_window(work):
    """Marginal inclusive cost per window by function, and the window length, of one work dir."""
    runs = []
    for cg in glob.glob(os.path.join(work, "cg.*")):
        arg = cg.rsplit(".", 1)[1]
        if not arg.isdigit():
            continue
        text = open(os.path.join(work, "out." + arg)).read()
        windows = int(re.search(r"samples (\d+)", text).group(1))
        runs.append((windows, cg))
    if len(runs) != 2:
        sys.exit(f"{work}: expected the callgrind outputs of two runs (KEEP=1 bench/pipeline_window.sh)")
    (w1, c1), (w2, c2) = sorted(runs)
    a, b = inclusive(c1), inclusive(c2)
    return {k: (b.get(k, 0) - a.get(k, 0)) / (w2 - w1) for k in set(a) | set(b)}


def main():
    d1, d10 = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 25
    p1, p10 = per_window(d1), per_window(d10)

    def split(k):
        c1, c10 = p1.get(k, 0.0), p10.get(k, 0.0)
        m = (c10 - c1) / 9000.0
        return c1 - 1000.0 * m, m, c1, c10

    top = [k for k in p1 if re.search(r"Pipeline::push_aux$", k)]
    if not top:
        sys.exit("no Pipeline::push_aux in the callgrind outputs")
    f, m, c1, c10 = split(top[0])
    print(f"Pipeline::push_aux: {c1:,.0f} per 1,000-instruction window ({c1 / 1000:.1f} per traced instruction), "
          f"{c10:,.0f} per 10,000 ({c10 / 10000:.1f}); fixed {f:,.0f} per window + {m:.2f} per traced instruction")
    print(f"{'per 1k window':>14} {'fixed F':>9} {'m':>7}  function (inclusive)")
    # (the project's functions that can be under it: not reading the replay's input, not its
    # callers; the allocator's and libc's callers are not told apart, so they are left out)
    outside = r"session::session::|serde|Deserializ|::push$|::push_now$|main$|replay::|engine::|aux::run_step"
    under = [k for k in p1 if "etm_" in k and p1[k] <= c1 * 1.001 and k != top[0] and not re.search(outside, k)]
    for k in sorted(under, key=lambda k: -p1[k])[:n]:
        f, m, c1k, _ = split(k)
        print(f"{c1k:14,.0f} {f:9,.0f} {m:7.2f}  {k[:110]}")


if __name__ == "__main__":
    main()
