//! Counter -> perf time conversion with the user page's `time_zero/time_mult/time_shift`.
//!
//! ETM/ETE timestamps are the (virtual) system counter; perf sample times are `perf_clock()`
//! (sched_clock). On arm64 `arch_perf_update_userpage()` publishes the sched_clock parameters
//! in every perf user page, and `tools/perf/util/tsc.c` converts with (etm-interface.md §5):
//!
//! ```text
//! if cap_user_time_short: cyc = time_cycles + ((cyc - time_cycles) & time_mask)
//! quot = cyc >> time_shift; rem = cyc & ((1 << time_shift) - 1)
//! t = time_zero + quot * time_mult + ((rem * time_mult) >> time_shift)
//! ```
//!
//! The parameters are read under the page's `lock` seqcount ([`read_clock`]).

use std::sync::atomic::Ordering;

use crate::ring::{UserPage, page};

/// Conversion parameters from the user page (or PERF_RECORD_TIME_CONV).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClockConv {
    pub time_zero: u64,
    pub time_mult: u32,
    pub time_shift: u16,
    pub time_cycles: u64,
    pub time_mask: u64,
    /// `cap_user_time_short`: the counter is narrower than 64 bits.
    pub short: bool,
}

impl ClockConv {
    /// Converts a counter value (e.g. an ETM timestamp) to perf time in ns.
    #[inline]
    pub fn to_perf_time(&self, cyc: u64) -> u64 {
        let cyc =
            if self.short { self.time_cycles.wrapping_add(cyc.wrapping_sub(self.time_cycles) & self.time_mask) } else { cyc };
        let shift = u32::from(self.time_shift.min(63));
        let mult = u64::from(self.time_mult);
        let quot = cyc >> shift;
        let rem = cyc & ((1u64 << shift) - 1);
        self.time_zero.wrapping_add(quot.wrapping_mul(mult)).wrapping_add(rem.wrapping_mul(mult) >> shift)
    }

    /// Inverse of [`to_perf_time`](Self::to_perf_time) (to within one counter tick), for
    /// looking up the counter value of a perf time; `None` if `time_mult` is 0 or `t` precedes
    /// `time_zero`.
    pub fn to_counter(&self, t: u64) -> Option<u64> {
        if self.time_mult == 0 || t < self.time_zero {
            return None;
        }
        let ns = u128::from(t - self.time_zero);
        let cyc = (ns << self.time_shift.min(63)) / u128::from(self.time_mult);
        u64::try_from(cyc).ok()
    }
}

/// Why the clock parameters could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ClockError {
    /// The kernel does not publish `time_zero` (no `cap_user_time_zero`): on arm64 this
    /// happens when sched_clock is not the architected counter.
    #[error("the perf user page has no cap_user_time_zero")]
    NoTimeZero,
    /// The seqcount kept changing (writer stuck or page corrupt).
    #[error("the perf user page lock did not settle after {0} tries")]
    Unstable(u32),
}

/// Reads the conversion parameters from a user page with the seqcount retry loop
/// (`lock` odd or changed -> retry), bounded to `max_tries`.
pub fn read_clock(pg: &UserPage<'_>, max_tries: u32) -> Result<ClockConv, ClockError> {
    for _ in 0..max_tries {
        let seq = pg.load_u32(page::LOCK, Ordering::Acquire);
        if seq & 1 != 0 {
            std::hint::spin_loop();
            continue;
        }
        let caps = pg.load_u64(page::CAPABILITIES, Ordering::Relaxed);
        let c = ClockConv {
            time_zero: pg.load_u64(page::TIME_ZERO, Ordering::Relaxed),
            time_mult: pg.load_u32(page::TIME_MULT, Ordering::Relaxed),
            time_shift: pg.load_u16(page::TIME_SHIFT, Ordering::Relaxed),
            time_cycles: pg.load_u64(page::TIME_CYCLES, Ordering::Relaxed),
            time_mask: pg.load_u64(page::TIME_MASK, Ordering::Relaxed),
            short: caps & page::CAP_USER_TIME_SHORT != 0,
        };
        std::sync::atomic::fence(Ordering::Acquire);
        if pg.load_u32(page::LOCK, Ordering::Relaxed) != seq {
            continue;
        }
        if caps & page::CAP_USER_TIME_ZERO == 0 {
            return Err(ClockError::NoTimeZero);
        }
        return Ok(c);
    }
    Err(ClockError::Unstable(max_tries))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// The split quot/rem formula equals the exact 128-bit value time_zero + cyc*mult >> shift
    /// over a spread of counter values, including ones where cyc*mult overflows 64 bits.
    #[test]
    fn matches_exact_arithmetic() {
        // 25 MHz counter (40 ns/tick): mult/shift as sched_clock would pick, shift 24.
        let c = ClockConv { time_zero: 1_000_000, time_mult: 40 << 24, time_shift: 24, ..Default::default() };
        for cyc in [0u64, 1, 25_000_000, 1 << 40, (1 << 55) + 12345, u64::MAX / 3] {
            let exact = 1_000_000u128 + ((u128::from(cyc) * u128::from(40u64 << 24)) >> 24);
            assert_eq!(u128::from(c.to_perf_time(cyc)), exact % (1u128 << 64), "cyc {cyc}");
        }
        assert_eq!(c.to_perf_time(25_000_000), 1_000_000 + 1_000_000_000);
        // Round trip within a tick.
        let t = c.to_perf_time(987_654_321);
        assert_eq!(c.to_counter(t), Some(987_654_321));
    }

    /// With cap_user_time_short, a 56-bit counter that wrapped is extended from time_cycles.
    #[test]
    fn short_counter() {
        let mask = (1u64 << 56) - 1;
        let c =
            ClockConv { time_zero: 0, time_mult: 1 << 20, time_shift: 20, time_cycles: mask - 10, time_mask: mask, short: true };
        // 5 ticks after the wrap: extended value = time_cycles + 16.
        assert_eq!(c.to_perf_time(5), mask - 10 + 16);
    }

    /// The seqlock reader returns the page's values, refuses a page without time_zero, and
    /// gives up (bounded) on a lock stuck odd.
    #[test]
    fn seqlock_read() {
        let words: Vec<AtomicU64> = (0..512).map(|_| AtomicU64::new(0)).collect();
        let pg = UserPage::new(&words).unwrap();
        let set = |off: usize, v: u64| words[off / 8].store(v, Ordering::Relaxed);
        set(page::LOCK, 4);
        set(page::TIME_SHIFT, (1000u64 << 32) | (10 << 16)); // shift 10 @50, mult 1000 @52
        set(page::TIME_ZERO, 777);
        set(page::CAPABILITIES, page::CAP_USER_TIME | page::CAP_USER_TIME_ZERO);
        let c = read_clock(&pg, 10).unwrap();
        assert_eq!((c.time_zero, c.time_mult, c.time_shift, c.short), (777, 1000, 10, false));
        assert_eq!(c.to_perf_time(1024), 777 + 1000);
        set(page::CAPABILITIES, page::CAP_USER_TIME);
        assert_eq!(read_clock(&pg, 10), Err(ClockError::NoTimeZero));
        set(page::LOCK, 5);
        assert_eq!(read_clock(&pg, 10), Err(ClockError::Unstable(10)));
    }
}
