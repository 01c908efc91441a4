//! Raw `perf_event_open` for the sampling events (aya 0.14 cannot set `branch_sample_type`,
//! clock ids or open arbitrary PMU configs, and attaching through our own fd lets every event
//! kind share one path: [`super::bpf::SampleBpf::attach_perf_fd`]).

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// `struct perf_event_attr` (PERF_ATTR_SIZE_VER8, 136 bytes), from `linux/perf_event.h`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PerfEventAttr {
    pub type_: u32,
    pub size: u32,
    pub config: u64,
    /// `sample_period` or, with the `freq` flag, `sample_freq`.
    pub sample_period_or_freq: u64,
    pub sample_type: u64,
    pub read_format: u64,
    /// The bit-field word (`disabled`, `inherit`, ..., see the `ATTR_*` constants).
    pub flags: u64,
    pub wakeup_events: u32,
    pub bp_type: u32,
    pub config1: u64,
    pub config2: u64,
    pub branch_sample_type: u64,
    pub sample_regs_user: u64,
    pub sample_stack_user: u32,
    pub clockid: i32,
    pub sample_regs_intr: u64,
    pub aux_watermark: u32,
    pub sample_max_stack: u16,
    pub reserved_2: u16,
    pub aux_sample_size: u32,
    pub aux_action: u32,
    pub sig_data: u64,
    pub config3: u64,
}

const _: () = assert!(std::mem::size_of::<PerfEventAttr>() == 136);

pub const PERF_TYPE_HARDWARE: u32 = 0;
pub const PERF_TYPE_SOFTWARE: u32 = 1;
pub const PERF_COUNT_HW_CPU_CYCLES: u64 = 0;
pub const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
pub const PERF_SAMPLE_BRANCH_STACK: u64 = 1 << 11;
pub const PERF_SAMPLE_BRANCH_USER: u64 = 1 << 0;
pub const PERF_SAMPLE_BRANCH_ANY: u64 = 1 << 3;

pub const ATTR_DISABLED: u64 = 1 << 0;
pub const ATTR_FREQ: u64 = 1 << 10;
pub const ATTR_USE_CLOCKID: u64 = 1 << 25;

const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
const PERF_EVENT_IOC_DISABLE: libc::c_ulong = 0x2401;

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
    let (type_, config) = match event {
        SampleEvent::Cycles => (PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES),
        SampleEvent::CpuClock => (PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK),
    };
    let mut attr = PerfEventAttr {
        type_,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config,
        sample_period_or_freq: freq,
        flags: ATTR_DISABLED | ATTR_FREQ | ATTR_USE_CLOCKID,
        // Same clock as bpf_ktime_get_ns() in the records.
        clockid: libc::CLOCK_MONOTONIC,
        ..Default::default()
    };
    if branches {
        attr.sample_type |= PERF_SAMPLE_BRANCH_STACK;
        attr.branch_sample_type = PERF_SAMPLE_BRANCH_USER | PERF_SAMPLE_BRANCH_ANY;
    }
    attr
}

/// `perf_event_open(attr, pid, cpu, group_fd = -1, PERF_FLAG_FD_CLOEXEC)`.
pub fn perf_event_open(attr: &PerfEventAttr, pid: i32, cpu: i32) -> io::Result<OwnedFd> {
    // SAFETY: attr points to a valid, correctly sized perf_event_attr.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr as *const PerfEventAttr,
            pid,
            cpu,
            -1i32,
            libc::c_ulong::from(8u8), // PERF_FLAG_FD_CLOEXEC
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn ioctl0(fd: &OwnedFd, req: libc::c_ulong) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain ioctl on a perf fd without argument.
    if unsafe { libc::ioctl(fd.as_raw_fd(), req, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `PERF_EVENT_IOC_ENABLE`.
pub fn enable(fd: &OwnedFd) -> io::Result<()> {
    ioctl0(fd, PERF_EVENT_IOC_ENABLE)
}

/// `PERF_EVENT_IOC_DISABLE`.
pub fn disable(fd: &OwnedFd) -> io::Result<()> {
    ioctl0(fd, PERF_EVENT_IOC_DISABLE)
}

/// Opens `event` on every CPU in `cpus` for all processes (the BPF program filters by tgid,
/// which also covers threads created later). Returns the fds in CPU order.
pub fn open_per_cpu(
    event: SampleEvent,
    freq: u64,
    branches: bool,
    cpus: &[u32],
) -> io::Result<Vec<OwnedFd>> {
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
        assert_eq!((a.type_, a.config, a.sample_period_or_freq), (1, 0, 999));
        assert_eq!(a.flags & (ATTR_DISABLED | ATTR_FREQ), ATTR_DISABLED | ATTR_FREQ);
        assert_eq!(a.branch_sample_type, 0);
        let b = sampling_attr(SampleEvent::Cycles, 99, true);
        assert_eq!(b.type_, PERF_TYPE_HARDWARE);
        assert_ne!(b.sample_type & PERF_SAMPLE_BRANCH_STACK, 0);
    }
}
