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
        let cyc = if self.short {
            self.time_cycles.wrapping_add(cyc.wrapping_sub(self.time_cycles) & self.time_mask)
        } else {
            cyc
        };
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
