//! Clocks of the live path: the user-page conversion (ETM timestamps -> perf clock), reading
//! "perf now" from the CPU counter, and the CLOCK_MONOTONIC -> perf clock offset needed for
//! eBPF records (which carry `bpf_ktime_get_ns()`), etm-interface.md §5.

use etm_perf::clock::read_clock;
use etm_perf::ring::UserPage;
use etm_session::session::ClockParams;

/// The session's clock parameters from a mapped user page (None without cap_user_time_zero).
pub fn clock_params(pg: &UserPage<'_>) -> Option<ClockParams> {
    let c = read_clock(pg, 1000).ok()?;
    Some(ClockParams {
        time_zero: c.time_zero,
        time_mult: c.time_mult,
        time_shift: c.time_shift,
        time_cycles: c.time_cycles,
        time_mask: c.time_mask,
        cap_user_time_short: c.short,
    })
}

/// Reads the counter the kernel's user-page conversion is defined on: CNTVCT_EL0 on arm64
/// (the ETM timestamp source), the TSC on x86_64.
pub fn counter() -> Option<u64> {
    #[cfg(target_arch = "aarch64")]
    {
        let v: u64;
        // SAFETY: CNTVCT_EL0 is readable at EL0 on Linux (CNTKCTL_EL1.EL0VCTEN set).
        unsafe { std::arch::asm!("isb", "mrs {}, cntvct_el0", out(reg) v) };
        Some(v)
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no memory effects.
        Some(unsafe { core::arch::x86_64::_rdtsc() })
    }
    #[cfg(not(any(target_arch = "aarch64", target_arch = "x86_64")))]
    {
        None
    }
}

/// Perf-clock "now" through the user page (None without time_zero or counter).
pub fn perf_now(pg: &UserPage<'_>) -> Option<u64> {
    let c: etm_perf::clock::ClockConv = read_clock(pg, 1000).ok()?;
    Some(c.to_perf_time(counter()?))
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid timespec pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `perf_clock - CLOCK_MONOTONIC` in ns from paired readings (the tightest of `tries`
/// monotonic/counter/monotonic brackets); µs-accurate at best. None without time_zero.
pub fn perf_minus_monotonic(pg: &UserPage<'_>, tries: usize) -> Option<i64> {
    let c = read_clock(pg, 1000).ok()?;
    let mut best: Option<(u64, i64)> = None;
    for _ in 0..tries.max(1) {
        let m1 = monotonic_ns();
        let cyc = counter()?;
        let m2 = monotonic_ns();
        let width = m2.saturating_sub(m1);
        let off = c.to_perf_time(cyc) as i64 - (m1 + width / 2) as i64;
        if best.is_none_or(|(w, _)| width < w) {
            best = Some((width, off));
        }
    }
    best.map(|(_, o)| o)
}

/// Converts a CLOCK_MONOTONIC time to the perf clock with an offset from
/// [`perf_minus_monotonic`].
pub fn monotonic_to_perf(t: u64, perf_minus_mono: i64) -> u64 {
    t.saturating_add_signed(perf_minus_mono)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Offsets apply in both directions without wrapping below zero.
    #[test]
    fn offset_applies() {
        assert_eq!(monotonic_to_perf(1_000, 500), 1_500);
        assert_eq!(monotonic_to_perf(1_000, -400), 600);
        assert_eq!(monotonic_to_perf(10, -400), 0);
    }
}
