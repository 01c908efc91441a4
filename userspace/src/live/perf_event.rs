//! Raw `perf_event_open` for the sampling events (aya 0.14 cannot set `branch_sample_type`,
//! clock ids or open arbitrary PMU configs, and attaching through our own fd lets every event
//! kind share one path: [`super::bpf::SampleBpf::attach_perf_fd`]).

use std::io;
use std::os::fd::OwnedFd;

use etm_perf::attr::{PERF_COUNT_HW_CPU_CYCLES, PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE, PerfEventAttr, flag};

use etm_live::sys;

pub const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
pub const PERF_SAMPLE_BRANCH_STACK: u64 = 1 << 11;
pub const PERF_SAMPLE_BRANCH_USER: u64 = 1 << 0;
pub const PERF_SAMPLE_BRANCH_ANY: u64 = 1 << 3;

/// The sampling event to open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleEvent {
    /// Hardware CPU cycles (needs a PMU).
    Cycles,
    /// The `cpu-clock` software event (hrtimer based; works everywhere).
    CpuClock,
}

impl SampleEvent {
    /// The perf name of the event.
    pub fn name(self) -> &'static str {
        match self {
            SampleEvent::Cycles => "cycles",
            SampleEvent::CpuClock => "cpu-clock",
        }
    }
}

/// The attr for a frequency-sampled, initially disabled event; with `branches` it also asks
/// for user branch records (LBR) so the BPF program can read them.
pub fn sampling_attr(event: SampleEvent, freq: u64, branches: bool) -> PerfEventAttr {
    let (ty, config) = match event {
        SampleEvent::Cycles => (PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES),
        SampleEvent::CpuClock => (PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK),
    };
    let mut attr = PerfEventAttr {
        sample_period: freq,
        flags: flag::DISABLED | flag::FREQ | flag::USE_CLOCKID,
        // Same clock as bpf_ktime_get_ns() in the records.
        clockid: libc::CLOCK_MONOTONIC,
        ..PerfEventAttr::new(ty, config)
    };
    if branches {
        attr.sample_type |= PERF_SAMPLE_BRANCH_STACK;
        attr.branch_sample_type = PERF_SAMPLE_BRANCH_USER | PERF_SAMPLE_BRANCH_ANY;
    }
    attr
}

/// `perf_event_open(attr, pid, cpu, group_fd = -1, PERF_FLAG_FD_CLOEXEC)`.
pub fn perf_event_open(attr: &PerfEventAttr, pid: i32, cpu: i32) -> io::Result<OwnedFd> {
    sys::open(attr, pid, cpu, None)
}

/// `PERF_EVENT_IOC_ENABLE`.
pub fn enable(fd: &OwnedFd) -> io::Result<()> {
    sys::ioctl0(fd, sys::PERF_EVENT_IOC_ENABLE)
}

/// `PERF_EVENT_IOC_DISABLE`.
pub fn disable(fd: &OwnedFd) -> io::Result<()> {
    sys::ioctl0(fd, sys::PERF_EVENT_IOC_DISABLE)
}

/// Opens `event` on every CPU in `cpus` for all processes (the BPF program filters by tgid,
/// which also covers threads created later). Returns the fds in CPU order.
pub fn open_per_cpu(event: SampleEvent, freq: u64, branches: bool, cpus: &[u32]) -> io::Result<Vec<OwnedFd>> {
    let attr = sampling_attr(event, freq, branches);
    cpus.iter().map(|&cpu| perf_event_open(&attr, -1, cpu as i32)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attr carries the documented bits: disabled + freq + monotonic clock, and branch
    /// sampling only when asked for.
    #[test]
    fn attr_bits() {
        let a = sampling_attr(SampleEvent::CpuClock, 999, false);
        assert_eq!((a.ty, a.config, a.sample_period), (1, 0, 999));
        assert_eq!(a.flags & (flag::DISABLED | flag::FREQ), flag::DISABLED | flag::FREQ);
        assert_eq!(a.to_bytes().len(), 136);
        assert_eq!(a.branch_sample_type, 0);
        let b = sampling_attr(SampleEvent::Cycles, 99, true);
        assert_eq!(b.ty, PERF_TYPE_HARDWARE);
        assert_ne!(b.sample_type & PERF_SAMPLE_BRANCH_STACK, 0);
    }
}
