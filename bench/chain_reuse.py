#!/usr/bin/env python3
"""How often sequences of several trace packets repeat with the same decode: the evidence for
(or against) a decoder cache over several packets (libxdc caches runs of several packets;
etm-decode's run cache covers one atom packet from a known address).

    bench/chain_reuse.py PACKETS ELEMENTS [--slots N ...] [--k K ...]

PACKETS and ELEMENTS are `etm-bpf decode --snapshot D --packets` and `etm-bpf decode
--snapshot D` listings of one trace (files, or `xz` files: the reference listings of
../shared/testdata/etm are OpenCSD's, in the same format).

A *chain* starts at an atom packet and takes up to K packets that are atom packets or target
address packets without context (the packets the decoder's atom-run loop takes), stopping at
any other packet. Chains tile the trace greedily, as a decoder would look them up: on a hit
it takes the whole chain, on a miss it decodes the chain packet by packet and stores it.

The key is what such a cache must compare to be exact, read from the listings:
* the address the chain starts from (its first range's start);
* the entries of the address history from before the chain that its exact-match and short
  address packets resolve through (the three last addresses: IHI 0064 "Address packets";
  every address packet, exact matches too, pushes its address);
* each packet of the chain (atoms; an address packet's match index, short or long field);
* the addresses the chain's compressed returns pop (a return stack entry pushed before the
  chain: an implementation compares those entries).

Printed per K and cache size: lookups per 1,000 packets, the share of the eligible packets
that hit chains cover, and the hit rate. K = 1 is a cache of single packets keyed the same
way (for an atom packet: its address and atoms, the key of today's run cache).
"""

import argparse
import lzma
import re
import zlib
from collections import defaultdict

PKT = re.compile(r"Idx:(\d+); ID:([0-9a-fA-F]+);\s*(\S+)\s*:(.*)$")
RANGE = re.compile(
    r"Idx:(\d+); ID:([0-9a-fA-F]+); OCSD_GEN_TRC_ELEM_INSTR_RANGE\(exec range=0x([0-9a-fA-F]+):\[0x([0-9a-fA-F]+)\].*?\) (E|N) (\S+)\s*(\S*)"
)
ADDR = re.compile(r"Addr=0x([0-9a-fA-F]+)")
TARGET = {"I_ADDR_MATCH", "I_ADDR_S_IS0", "I_ADDR_S_IS1", "I_ADDR_L_32IS0", "I_ADDR_L_32IS1", "I_ADDR_L_64IS0", "I_ADDR_L_64IS1"}


def lines(path):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt", errors="replace") as f:
        yield from f


def load(packets_path, elements_path):
    """Per trace ID: the packets [(idx, type, payload, address or None)] and the ranges by
    packet index [(start, indirect taken)]."""
    pkts = defaultdict(list)
    for line in lines(packets_path):
        m = PKT.match(line.strip())
        if not m:
            continue
        idx, tid, ty, rest = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        a = ADDR.search(rest)
        # the packet as its bytes say it: atoms; the match index; a short address's field
        payload = rest.split(";")[-1] if ty.startswith("I_ATOM") else rest
        if ty == "I_ADDR_MATCH":
            payload = re.search(r"\[(\d)\]", rest).group(1)
        elif ty.startswith("I_ADDR_S"):
            payload = rest.split("~")[-1]
        pkts[tid].append((idx, ty, payload.strip(), int(a.group(1), 16) if a else None))
    ranges = defaultdict(lambda: defaultdict(list))
    for line in lines(elements_path):
        m = RANGE.match(line.strip())
        if m:
            indirect = m.group(5) == "E" and m.group(6) == "iBR"
            ranges[m.group(2)][int(m.group(1))].append((int(m.group(3), 16), indirect))
    return pkts, ranges


def simulate(pkts, ranges, k, slots):
    lookups = hits = covered = eligible = total = 0
    for tid, ps in pkts.items():
        rs = ranges.get(tid, {})
        table = {}
        hist = [None, None, None]
        prev_indirect = False
        i = 0
        total += len(ps)
        while i < len(ps):
            _, ty, _, addr = ps[i]
            if not ty.startswith("I_ATOM"):
                # (taken alone: any packet but an atom packet supplies the next address or
                # ends the run, so no compressed return follows it)
                if addr is not None:
                    hist = [addr, hist[0], hist[1]]
                eligible += ty in TARGET
                prev_indirect = False
                i += 1
                continue
            j = i
            key = []
            start = None
            # the history as the chain sees it: its entries from before the chain as their
            # position, so that only those the chain's packets resolve through are keyed
            h = [("h", 0), ("h", 1), ("h", 2)]
            used = set()
            pi = prev_indirect
            while j < len(ps) and j - i < k and (ps[j][1].startswith("I_ATOM") or ps[j][1] in TARGET):
                _, t, pl, a = ps[j]
                key.append((t, pl))
                if a is not None:
                    ref = None
                    if t == "I_ADDR_MATCH":
                        ref = h[min(int(pl), 2)]
                    elif t.startswith("I_ADDR_S"):
                        ref = h[0]
                    if isinstance(ref, tuple):
                        used.add(ref[1])
                    h = [a, h[0], h[1]]
                    pi = False
                for s, ind in rs.get(ps[j][0], []):
                    if start is None:
                        start = s
                    if pi and a is None:
                        # a compressed return's popped address
                        key.append(("pop", s))
                    pi = ind
                j += 1
            key.insert(0, start)
            key.insert(1, tuple((u, hist[u]) for u in sorted(used)))
            key = tuple(key)
            lookups += 1
            # (a stable hash: the figures do not change from run to run)
            slot = zlib.crc32(repr(key).encode()) % slots
            n = j - i
            eligible += n
            if table.get(slot) == key:
                hits += 1
                covered += n
            else:
                table[slot] = key
            hist = [hist[x[1]] if isinstance(x, tuple) else x for x in h]
            prev_indirect = pi
            i = j
    return lookups, hits, covered, eligible, total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("packets")
    ap.add_argument("elements")
    ap.add_argument("--slots", type=int, nargs="*", default=[4096, 65536])
    ap.add_argument("--k", type=int, nargs="*", default=[1, 2, 4, 8, 16])
    a = ap.parse_args()
    pkts, ranges = load(a.packets, a.elements)
    print("K  slots  lookups/1k packets  eligible covered by hits  hit rate")
    for k in a.k:
        for s in a.slots:
            lookups, hits, covered, eligible, total = simulate(pkts, ranges, k, s)
            print(
                f"{k:<2} {s:>6}  {1000 * lookups / max(total, 1):18.1f}  {100 * covered / max(eligible, 1):23.1f}%  {100 * hits / max(lookups, 1):7.1f}%"
            )


if __name__ == "__main__":
    main()
