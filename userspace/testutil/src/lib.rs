//! Test support shared by the etm-bpf crates.
//!
//! A test that cannot run here (no root, a missing tool or data set) calls [`skip`] with the
//! reason instead of passing silently:
//!
//! * under `CI=true` a skip is a failure: CI installs every tool and data set the suite needs,
//!   so a missing one is a broken set-up, not a reason to pass;
//! * otherwise it prints `SKIP: <reason>` and, when `ETM_BPF_SKIP_LOG` names a file, appends
//!   one line to it, so `scripts/test.sh` can count run-time skips in its closing line (the
//!   test harness captures the output of passing tests, which would hide the `SKIP:` lines).

use std::fmt::Display;
use std::io::Write as _;

/// Whether skips are failures (`CI` is `true` or `1`).
pub fn skips_fail() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Records that (part of) a test did not run, for `reason`. Panics under CI; the caller returns
/// (or carries on without the part) otherwise.
#[track_caller]
pub fn skip(reason: impl Display) {
    let reason = reason.to_string();
    if skips_fail() {
        panic!("required under CI=true, but this test would skip: {reason}");
    }
    eprintln!("SKIP: {reason}");
    if let Some(path) = std::env::var_os("ETM_BPF_SKIP_LOG")
        && let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path)
    {
        let test = std::thread::current().name().unwrap_or("?").to_string();
        let _ = writeln!(f, "{test}: {}", reason.replace('\n', " "));
    }
}

/// Burns `ms` milliseconds of this thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), giving up
/// after `max_wall_s` seconds of wall time: tests that count samples of a clock event need
/// CPU time, which a loaded machine hands out at a fraction of the wall clock.
pub fn spin_cpu_ms(ms: u64, max_wall_s: u64) {
    fn cpu_ns() -> u64 {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: a valid timespec out-pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }
    let (t, c0) = (std::time::Instant::now(), cpu_ns());
    let mut x = 1u64;
    while cpu_ns() - c0 < ms * 1_000_000 && t.elapsed().as_secs() < max_wall_s {
        for _ in 0..1000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
}

/// CPU time (user + system) process `pid` has used, in seconds (`/proc/PID/stat`, clock
/// ticks of `getconf CLK_TCK`, 100 on Linux); `None` if it is gone. Benchmarks on the shared
/// machine measure CPU time because wall time scales with the load.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the comm (which may hold spaces and parentheses): utime and stime are fields 14
    // and 15 of the whole line.
    let f: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// A `kB` field of this process's `/proc/self/status` (`VmRSS`, `VmHWM`, ...); 0 if absent.
pub fn self_status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A global allocator that counts the allocations (and reallocations) of the thread inside
/// [`count_allocations`]; install it in a test binary with
/// `#[global_allocator] static A: etm_testutil::CountingAlloc = etm_testutil::CountingAlloc;`.
/// Only the measuring thread counts (the test harness allocates on other threads).
pub struct CountingAlloc;

static ALLOCS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
thread_local! {
    static COUNTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn count_one() {
    if COUNTING.try_with(|a| a.get()).unwrap_or(false) {
        ALLOCS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        count_one();
        // SAFETY: the caller's contract, passed on.
        unsafe { std::alloc::System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { std::alloc::System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, n: usize) -> *mut u8 {
        count_one();
        // SAFETY: the caller's contract, passed on.
        unsafe { std::alloc::System.realloc(p, l, n) }
    }
}

/// Runs `f` and returns how many allocations this thread made in it (with [`CountingAlloc`]
/// installed as the global allocator; 0 otherwise).
pub fn count_allocations(f: impl FnOnce()) -> u64 {
    let before = ALLOCS.load(std::sync::atomic::Ordering::Relaxed);
    COUNTING.with(|a| a.set(true));
    f();
    COUNTING.with(|a| a.set(false));
    ALLOCS.load(std::sync::atomic::Ordering::Relaxed) - before
}
