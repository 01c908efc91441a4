#!/usr/bin/env bash
# One command from a clean clone (as root): set up, build etm-bpf (release) and profile.
#
#   scripts/run.sh                      live view on the bundled demo (demo/demo.c); q quits
#   scripts/run.sh --pid N [options]    `etm-bpf run --pid N [options]` on your process
#   scripts/run.sh --headless --duration 10 --dump-dir out    (demo, no terminal UI)
#
# Without --pid the demo is built with frame pointers and started by `etm-bpf run [options] --
# demo`, so it is profiled from its first instruction (under sudo it runs as you); it stops
# when the view quits or --duration ends. Without a terminal on stdout the demo runs
# headless for 10 s.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
cargo build --release --locked -p etm-bpf
bin="${CARGO_TARGET_DIR:-target}/release/etm-bpf"

for a in "$@"; do
  case "$a" in
    --pid|--pid=*) exec "$bin" run "$@" ;;
  esac
done

cc=""
for c in clang-22 clang gcc cc; do
  if command -v "$c" >/dev/null 2>&1; then cc="$c"; break; fi
done
[ -n "$cc" ] || { echo "run.sh: no C compiler found for the demo" >&2; exit 1; }
demo_dir="${CARGO_TARGET_DIR:-target}/demo"
mkdir -p "$demo_dir"
"$cc" -O1 -g -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer -fno-optimize-sibling-calls \
  -pthread -o "$demo_dir/demo" demo/demo.c
extra=()
demo_args=()
if [ ! -t 1 ]; then
  case " $* " in *" --headless "*) ;; *) extra=(--headless) ;; esac
  # The demo stops by itself after 10 s unless --duration says otherwise.
  case " $* " in *" --duration "*) ;; *) demo_args=(10) ;; esac
fi
echo "run.sh: profiling the demo" >&2
status=0
"$bin" run "${extra[@]}" "$@" -- "$demo_dir/demo" "${demo_args[@]}" || status=$?
# The demo serves until it is stopped: SIGTERM (143) at the end of the view or --duration.
[ "$status" -eq 143 ] && status=0
exit "$status"
