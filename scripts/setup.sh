#!/usr/bin/env bash
# Installs everything etm-bpf needs on a fresh Debian 12 machine (run as root).
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PKGS=(
  # bpf-linker links against the same LLVM major as rustc 1.95 (LLVM 22)
  llvm-22-dev libllvm22
  # PGO consumers used by the profile tests (llvm-profgen-22, llvm-profdata-22, perf2bolt-22)
  llvm-22 clang-22 bolt-22
  # AArch64 ground truth: cross compiler + user-mode emulation
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross binutils-aarch64-linux-gnu qemu-user
  # peers and tools: perf (overhead benchmark), OpenCSD trc_pkt_lister (independent decoder)
  linux-perf libopencsd-bin xz-utils valgrind pkg-config libelf-dev zlib1g-dev
  # peak RSS in the benchmarks (/usr/bin/time: bench/hw_replay.sh, bench/profile.sh)
  time
  # the unwinding tests against perf: a C++ workload built by g++ and clang++-22, and the
  # system python3 (tests/tests/run_peers.rs)
  g++ python3
  # go tool pprof reads the profile.pb.gz dumps in the tests (-lines, -list, -disasm)
  golang-go
  # the kernel lab (cargo xtask lab arm64): an arm64 guest kernel under emulation
  qemu-system-arm cpio curl
)

missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
# rust-toolchain.toml pins the toolchain; make sure it and rust-src are there.
rustup show active-toolchain >/dev/null 2>&1 || rustup toolchain install
rustup component add rust-src >/dev/null 2>&1
# The lab cross builds the product for its arm64 guest.
rustup target list --installed | grep -qx aarch64-unknown-linux-gnu || rustup target add aarch64-unknown-linux-gnu >/dev/null

if ! command -v bpf-linker >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/bpf-linker" ]; then
  echo "setup: building bpf-linker 0.13.0 against LLVM 22 (1-2 min)" >&2
  CARGO_PROFILE_RELEASE_DEBUG=false LLVM_PREFIX=/usr/lib/llvm-22 \
    cargo install bpf-linker --version 0.13.0 --locked --no-default-features --features llvm-22
fi
# run --follow-children attaches to the task:task_newtask tracepoint, found through tracefs
# (systemd mounts it; minimal VMs and containers may not).
if [ ! -e /sys/kernel/tracing/events ] && [ ! -e /sys/kernel/debug/tracing/events ]; then
  mount -t tracefs nodev /sys/kernel/tracing ||
    echo "setup: cannot mount tracefs on /sys/kernel/tracing (run --follow-children needs it)" >&2
fi
echo "setup: ok" >&2
