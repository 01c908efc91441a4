# Python workload for the unwinding tests against perf (run by the system python3, whose
# interpreter and libz have no frame pointers).
# Two hot Python functions: hot_crc runs zlib.crc32 over 1 MiB (native leaf crc32_z in libz),
# hot_sort sorts a copy of 20000 shuffled ints (native leaf in the interpreter's list sort).
# The loop calls whichever is behind its target share of this thread's CPU time, measured with
# time.thread_time() (the kernel's per-thread CPU clock), so hot_crc gets 2/3 and hot_sort 1/3
# of the CPU spent in the two (each call is ~1 ms, the bookkeeping ~1 us).
# `python3 hot.py SECONDS`: prints "ready PID", runs for SECONDS.
import os
import random
import sys
import time
import zlib

buf = os.urandom(1 << 20)
data = list(range(20000))
random.Random(1).shuffle(data)


def hot_crc():
    return zlib.crc32(buf)


def hot_sort():
    return sorted(data)[0]


print("ready", os.getpid(), flush=True)
end = time.monotonic() + float(sys.argv[1])
spent = {hot_crc: 0.0, hot_sort: 0.0}
while time.monotonic() < end:
    f = hot_crc if spent[hot_crc] <= 2 * spent[hot_sort] else hot_sort
    t0 = time.thread_time()
    f()
    spent[f] += time.thread_time() - t0
