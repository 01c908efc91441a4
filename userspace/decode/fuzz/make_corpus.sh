#!/usr/bin/env bash
# Seeds fuzz/corpus/packets/ from the real captures in ../shared/testdata/etm: for each trace
# buffer, slices of 256 bytes prefixed by the 7 selector bytes `check` reads (format/protocol,
# config, split seed), one set per stream format the file really has.
set -euo pipefail
cd "$(dirname "$0")"
etm="${ETM_BPF_SHARED:-$(cd ../../../.. && pwd)/shared}/testdata/etm"
out=corpus/packets
mkdir -p "$out"
# selector byte 0: bits 0-1 format (0 coresight, 1 raw, 2 tpiu, 3 dstream), bit 2 ETE
seed() { # file selector0 name
  local f=$1 sel=$2 name=$3 size n i
  size=$(stat -c %s "$f")
  n=$(( size / 256 )); [ "$n" -gt 64 ] && n=64
  for ((i = 0; i < n; i++)); do
    { printf "\\x$(printf %02x "$sel")\\x00\\x00\\x00\\x00\\x00\\x$(printf %02x "$i")"
      dd if="$f" bs=256 skip=$(( i * size / 256 / (n > 0 ? n : 1) )) count=1 status=none; } > "$out/$name-$i"
  done
}
seed "$etm/juno_r1_1/cstrace.bin" 0 juno
seed "$etm/bugfix-exact-match/cstrace.bin" 0 bugfix
seed "$etm/a55-test-tpiu/DSTREAM_0.bin" 3 a55
for d in ete_ip src_addr texit-poe2 maxspec78_commopt0 tme_test ete_mem; do
  seed "$etm/$d/session1.bin" 5 "$d"
done
seed "$etm/perf-data/perf_kernel.snapshot/aux_cpu6.bin" 0 perfk
ls "$out" | wc -l
