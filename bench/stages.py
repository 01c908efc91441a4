#!/usr/bin/env python3
"""Marginal self cost per trace window, grouped by pipeline stage.

    bench/stages.py CG_SHORT CG_LONG WINDOWS [BRANCHES]

CG_SHORT and CG_LONG are callgrind outputs of `etm-bpf replay` of a short and a long session
of one program (bench/pipeline_window.sh makes them; STAGES=1 there runs this), WINDOWS the
difference in windows between them. Each function's self instructions are put in the first
stage whose pattern matches its name; "replay input" (reading events.jsonl) is outside
`Pipeline::push_aux`, the rest adds up to it within a few per cent. With BRANCHES, the
difference in branch records between the two runs, each stage's cost per branch record too.
(perf's branch rule, `etm_decode::branches::BranchRule`, is inlined into the session's
`Adapter::ranges`: its cost is the adapter's, by that function's name.)
"""
import re
import subprocess
import sys

STAGES = [
    ("decoder", r"etm_decode::|Fs<M,S>|Deformatter|PacketParser|Lookahead|RetStack|BlockCache|store_cached_run"),
    ("replay input (outside push_aux)",
     r"SessionReader|serde|^de::|read::|from_utf8|memchr|io::|parse_|Deserializ|Content|from_trait|skip_to|session::_::"),
    ("exact counts", r"exact::|shadow::|Names::"),
    ("synthesized samples: backward walk", r"join::synthesize|UndoWalk|CodeCache|Facts"),
    ("adapter: perf's rule, batches", r"decoder::Adapter|EtmWindowDecoder|ElemSink|flush_batches"),
    ("profile: pause and synthesized samples",
     r"etm_profile::|model::|agg::|HybridProfile|BinaryAgg|Sink::accept|trie::|ContextTrie|frame_cache|FrameCache|store::"),
    ("join of the pause sample, window sink", r"join::|Joiner|WinSink|pipeline::|window::|aux::|code::|CodeMap"),
    ("allocator, libc", r"malloc|free|realloc|memcpy|memmove|memset|alloc|_int_|__rust"),
]


def load(path):
    out = subprocess.run(["callgrind_annotate", "--auto=no", "--inclusive=no", "--threshold=100", path],
                         capture_output=True, text=True, check=True).stdout
    cost = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(?:\S*?\.rs:|\?\?\?:|\S*?\.[chS]:)?(.*?)(\s+\[[^\]]*\])?$", line)
        if m and "PROGRAM TOTALS" not in line:
            cost[m.group(2)] = cost.get(m.group(2), 0) + int(m.group(1).replace(",", ""))
    return cost


def main():
    short, long_, windows = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3])
    branches = int(sys.argv[4]) / windows if len(sys.argv) > 4 else None
    total = {name: 0.0 for name, _ in STAGES}
    other = {}
    for fn, ir in long_.items():
        per = (ir - short.get(fn, 0)) / windows
        for name, pat in STAGES:
            if re.search(pat, fn):
                total[name] += per
                break
        else:
            other[fn] = per
    rows = [(total[name], name) for name, _ in STAGES] + [(sum(other.values()), "other")]
    if branches:
        print(f"{branches:.1f} branch records per window; per window, per branch record:")
    for ir, name in rows:
        print(f"{ir:9.0f}  {ir / branches:5.0f}  {name}" if branches else f"{ir:9.0f}  {name}")


if __name__ == "__main__":
    main()
