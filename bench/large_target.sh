#!/usr/bin/env bash
# Large target (bench/README.md "Large target"): `etm-bpf run --pid` on clang++-22 compiling
# bench/big_cc.py's big.cc (clang's code is libLLVM.so.22.1, ~150 MB). Prints the time from
# etm-bpf's start to its first status line with samples in it, etm-bpf's peak RSS, and the
# manifest's load figures for libLLVM (image read/mapped, registered, unwind entries
# registered, symbol table + DWARF loaded at the first address named in it, first frame named).
# Root. Env: ETM_BPF_BIN (target/release/etm-bpf), DURATION (8), UNWIND (auto).
set -euo pipefail
BIN=${ETM_BPF_BIN:-target/release/etm-bpf}
DURATION=${DURATION:-8}
UNWIND=${UNWIND:-auto}
W=$(mktemp -d)
trap 'kill $CC 2>/dev/null || true; rm -rf "$W"' EXIT
python3 "$(dirname "$0")/big_cc.py" "$W/big.cc"
clang++-22 -O2 -c "$W/big.cc" -o "$W/big.o" &
CC=$!
# clang-22 runs cc1 in its own process (-fintegrated-cc1): profile it once libLLVM is mapped.
P=$CC
for _ in $(seq 100); do
    grep -q libLLVM "/proc/$P/maps" 2>/dev/null && break
    sleep 0.05
done
t0=$(date +%s.%N)
/usr/bin/time -f '%M' -o "$W/rss" "$BIN" run --pid "$P" --headless --duration "$DURATION" --unwind "$UNWIND" \
    --dump-dir "$W/dump" 2>"$W/err" | while IFS= read -r line; do
    printf '%s %s\n' "$(date +%s.%N)" "$line"
done >"$W/out"
first=$(awk '/ samples [1-9]/ {print $1; exit}' "$W/out")
echo "first status line with samples: $(echo "$first - $t0" | bc) s after start"
echo "etm-bpf max RSS: $(cat "$W/rss") KiB"
python3 - "$W/dump/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
for b in m["binaries"]:
    if "libLLVM" in b["path"] or "clang" in b["path"]:
        print(b["path"], b.get("load"))
print("samples", m["samples"], "unwind", {k: v for k, v in m["counts"]["unwind"].items() if k in ("dwarf_stacks", "unwind_ns_per_sample")})
PY
