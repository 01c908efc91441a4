//! Raw `perf_event_open` for the sampling events (aya 0.14 cannot set `branch_sample_type`,
//! clock ids or open arbitrary PMU configs, and attaching through our own fd lets every event
//! kind share one path: [`super::bpf::SampleBpf::attach_perf_fd`]).

use std::io;
use std::os::fd::OwnedFd;

use etm_perf::attr::{PERF_COUNT_HW_CPU_CYCLES, PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE, PerfEventAttr, flag};

use etm_live::sys;

pub const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
#[cfg(test)]
pub const PERF_SAMPLE_CALLCHAIN: u64 = 1 << 5;
pub const PERF_SAMPLE_BRANCH_STACK: u64 = 1 << 11;
pub const PERF_SAMPLE_BRANCH_USER: u64 = 1 << 0;
#[cfg(test)]
pub const PERF_SAMPLE_BRANCH_KERNEL: u64 = 1 << 1;
#[cfg(test)]
pub const PERF_SAMPLE_BRANCH_HV: u64 = 1 << 2;
pub const PERF_SAMPLE_BRANCH_ANY: u64 = 1 << 3;
#[cfg(test)]
pub const PERF_SAMPLE_BRANCH_NO_FLAGS: u64 = 1 << 14;
#[cfg(test)]
pub const PERF_SAMPLE_BRANCH_NO_CYCLES: u64 = 1 << 15;
pub const PERF_SAMPLE_BRANCH_TYPE_SAVE: u64 = 1 << 16;

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
/// for user branch records (LBR/BRBE) so the BPF program can read them.
///
/// A branch event counts user cycles only (`exclude_kernel`, `exclude_hv`: `cycles:u -j
/// any,u`): `perf_copy_attr` derives the branch filter's privilege levels from the exclude
/// flags only when `branch_sample_type` names none, and the exclude flags are what stop the
/// counter in the kernel (`perf_exclude_event`, the PMU's privilege filter), so with
/// `branch_sample_type = USER|ANY` alone a sample taken in a syscall would carry the user
/// syscall site as its leaf and weigh the 32 user branches before it. Stack-only events keep
/// counting in the kernel: their user stack says on whose behalf that CPU time was spent.
///
/// `PERF_SAMPLE_BRANCH_TYPE_SAVE` fills each entry's `type` (call, return, ...) where the
/// hardware does not: legacy LBR and AMD classify in software (`intel_pmu_setup_sw_lbr_filter`,
/// `amd_pmu_lbr_setup_filter` -> `X86_BR_TYPE_SAVE`); Arch LBR (`intel_pmu_setup_hw_lbr_filter`)
/// and BRBE (`brbe_set_perf_entry_type`) fill it anyway. The join checks calls and returns
/// with it.
///
/// Not set, on purpose (docs/lbr.md): `precise_ip` (`perf_event_set_bpf_handler` refuses a
/// program calling `bpf_get_stack` with `-EPROTO` unless `PERF_SAMPLE_CALLCHAIN` is asked
/// for, and the callchain copy would start with `PERF_CONTEXT_USER`),
/// `PERF_SAMPLE_BRANCH_NO_FLAGS`/`NO_CYCLES` (`amd_pmu_lbr_setup_filter` maps both to
/// `LBR_NOT_SUPP`: AMD refuses the event).
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
        attr.flags |= flag::EXCLUDE_KERNEL | flag::EXCLUDE_HV;
        attr.sample_type |= PERF_SAMPLE_BRANCH_STACK;
        attr.branch_sample_type = PERF_SAMPLE_BRANCH_USER | PERF_SAMPLE_BRANCH_ANY | PERF_SAMPLE_BRANCH_TYPE_SAVE;
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

/// Opens `event` on every thread of process `pid` (`pid = tid, cpu = -1`) with `inherit`, so
/// threads those threads create later get the event (and its BPF program: `inherit_event`
/// copies `parent_event->prog`). Threads that exit meanwhile are skipped. Returns the fds.
pub fn open_per_thread(event: SampleEvent, freq: u64, branches: bool, pid: u32) -> io::Result<Vec<OwnedFd>> {
    let mut attr = sampling_attr(event, freq, branches);
    attr.flags |= flag::INHERIT;
    let mut fds = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        match perf_event_open(&attr, tid, -1) {
            Ok(fd) => fds.push(fd),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(e) => return Err(e),
        }
    }
    if fds.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    Ok(fds)
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

    /// The branch-record units, as the kernel tells them apart when it sets up the filter.
    #[derive(Clone, Copy, Debug)]
    enum Unit {
        /// Legacy Intel LBR (`intel_pmu_setup_hw_lbr_filter` with `hsw/skl_lbr_sel_map`).
        IntelLbr,
        /// Arch LBR with CPL and filtering (`arch_lbr_ctl_map`, `intel_pmu_arch_lbr_init`).
        ArchLbr,
        /// AMD LBRv2 (`amd_pmu_lbr_setup_filter`, `lbr_select_map`).
        AmdLbrV2,
        /// Arm BRBE (`brbe_branch_attr_valid`).
        Brbe,
    }

    /// What the kernel does with a branch event's attr, written from the kernel sources
    /// (linux 7.1 `kernel/events/core.c`, `arch/x86/events/{intel,amd}/lbr.c`,
    /// `drivers/perf/arm_brbe.c`), not from this crate's code: `Ok(effective
    /// branch_sample_type)` or the errno name the open (or the BPF attach) fails with.
    fn kernel_model(unit: Unit, a: &PerfEventAttr, bpf_calls_get_stack: bool) -> Result<u64, &'static str> {
        const PLM_ALL: u64 = PERF_SAMPLE_BRANCH_USER | PERF_SAMPLE_BRANCH_KERNEL | PERF_SAMPLE_BRANCH_HV;
        const MAX: u64 = 1 << 20; // PERF_SAMPLE_BRANCH_MAX (7.1: COUNTERS is shift 19)
        let bit = |s: u32| 1u64 << s;
        let mut mask = a.branch_sample_type;
        // perf_copy_attr: defined bits only, one branch kind, privilege levels from the
        // exclude flags only when none is named.
        if mask & !(MAX - 1) != 0 || mask & !PLM_ALL == 0 {
            return Err("EINVAL");
        }
        if mask & PLM_ALL == 0 {
            if a.flags & flag::EXCLUDE_KERNEL == 0 {
                mask |= PERF_SAMPLE_BRANCH_KERNEL;
            }
            if a.flags & flag::EXCLUDE_USER == 0 {
                mask |= PERF_SAMPLE_BRANCH_USER;
            }
            if a.flags & flag::EXCLUDE_HV == 0 {
                mask |= PERF_SAMPLE_BRANCH_HV;
            }
        }
        let not_supp: u64 = match unit {
            // skl_hsw_lbr_sel_map / hsw_lbr_sel_map: every unlisted bit is LBR_IGN.
            Unit::IntelLbr => 0,
            // arch_lbr_ctl_map with lbr_cpl and lbr_filter: nothing NOT_SUPP (call stack
            // only without lbr_call_stack).
            Unit::ArchLbr => 0,
            // lbr_select_map: ABORT_TX, IN_TX, NO_TX, CALL_STACK, NO_FLAGS, NO_CYCLES.
            Unit::AmdLbrV2 => bit(7) | bit(8) | bit(9) | bit(11) | bit(14) | bit(15),
            // BRBE_EXCLUDE_BRANCH_FILTERS.
            Unit::Brbe => bit(7) | bit(8) | bit(9) | bit(11) | bit(19),
        };
        if mask & not_supp != 0 {
            return Err("EOPNOTSUPP");
        }
        if let Unit::Brbe = unit {
            // brbe_branch_attr_valid: a branch type, and not host-less or user+kernel-less.
            const TYPES: u64 = (1 << 3) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 10) | (1 << 12) | (1 << 13);
            let both = flag::EXCLUDE_USER | flag::EXCLUDE_KERNEL;
            if mask & TYPES == 0 || a.flags & flag::EXCLUDE_HOST != 0 || a.flags & both == both {
                return Err("EOPNOTSUPP");
            }
        }
        // perf_event_set_bpf_handler: precise_ip + bpf_get_stack needs the full callchain.
        let precise = (a.flags >> flag::PRECISE_IP_SHIFT) & 3;
        let full_chain = a.sample_type & PERF_SAMPLE_CALLCHAIN != 0
            && a.flags & (flag::EXCLUDE_CALLCHAIN_KERNEL | flag::EXCLUDE_CALLCHAIN_USER) == 0;
        if precise != 0 && bpf_calls_get_stack && !full_chain {
            return Err("EPROTO");
        }
        Ok(mask)
    }

    /// Whether the counter itself runs in the kernel: `x86_pmu_hw_config` sets
    /// ARCH_PERFMON_EVENTSEL_OS, `armv8pmu_set_event_filter` leaves EL1 in, unless
    /// `exclude_kernel`.
    fn counts_kernel(a: &PerfEventAttr) -> bool {
        a.flags & flag::EXCLUDE_KERNEL == 0
    }

    /// The branch event's bytes, pinned: the same attr on Intel LBR, Arch LBR, AMD LBRv2 and
    /// BRBE, accepted by each unit's filter setup, counting user cycles only, with user
    /// branches only, no precise_ip, no NO_FLAGS/NO_CYCLES, no callchain.
    #[test]
    fn branch_event_bytes_pinned_per_platform() {
        let a = sampling_attr(SampleEvent::Cycles, 999, true);
        let b = a.to_bytes();
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        use etm_perf::attr::offset;
        assert_eq!(u32::from_le_bytes(b[0..4].try_into().unwrap()), PERF_TYPE_HARDWARE);
        assert_eq!(u64_at(offset::CONFIG), PERF_COUNT_HW_CPU_CYCLES);
        // disabled(0) freq(10) use_clockid(25) exclude_kernel(5) exclude_hv(6); precise_ip
        // (15-16) zero.
        assert_eq!(u64_at(offset::FLAGS), (1 << 0) | (1 << 5) | (1 << 6) | (1 << 10) | (1 << 25));
        // PERF_SAMPLE_BRANCH_STACK only (no CALLCHAIN: bpf_get_stack walks the user stack).
        assert_eq!(u64_at(offset::SAMPLE_TYPE), 1 << 11);
        // PERF_SAMPLE_BRANCH_USER | PERF_SAMPLE_BRANCH_ANY | PERF_SAMPLE_BRANCH_TYPE_SAVE.
        let want = (1 << 0) | (1 << 3) | (1 << 16);
        assert_eq!(u64_at(offset::BRANCH_SAMPLE_TYPE), want);
        for unit in [Unit::IntelLbr, Unit::ArchLbr, Unit::AmdLbrV2, Unit::Brbe] {
            assert_eq!(kernel_model(unit, &a, true), Ok(want), "{unit:?}");
        }
        assert!(!counts_kernel(&a), "cycles must stop in the kernel");
        // The stack-only events keep the kernel time (and have no branch filter).
        assert!(counts_kernel(&sampling_attr(SampleEvent::Cycles, 999, false)));
    }

    /// The traps the pinned attr keeps out, shown on the model: without the exclude flags
    /// the counter runs in the kernel although the branch filter is user-only; NO_FLAGS or
    /// NO_CYCLES make AMD refuse the event; precise_ip makes the BPF attach fail.
    #[test]
    fn the_traps_on_the_model() {
        let good = sampling_attr(SampleEvent::Cycles, 999, true);
        let mut k = good;
        k.flags &= !(flag::EXCLUDE_KERNEL | flag::EXCLUDE_HV);
        assert_eq!(kernel_model(Unit::IntelLbr, &k, true), Ok(k.branch_sample_type), "USER named: no propagation");
        assert!(counts_kernel(&k));
        for extra in [PERF_SAMPLE_BRANCH_NO_FLAGS, PERF_SAMPLE_BRANCH_NO_CYCLES] {
            let mut a = good;
            a.branch_sample_type |= extra;
            assert_eq!(kernel_model(Unit::AmdLbrV2, &a, true), Err("EOPNOTSUPP"));
            assert!(kernel_model(Unit::IntelLbr, &a, true).is_ok());
            assert!(kernel_model(Unit::Brbe, &a, true).is_ok());
        }
        let mut p = good;
        p.flags |= 2 << flag::PRECISE_IP_SHIFT;
        assert_eq!(kernel_model(Unit::IntelLbr, &p, true), Err("EPROTO"));
        p.sample_type |= PERF_SAMPLE_CALLCHAIN;
        assert!(kernel_model(Unit::IntelLbr, &p, true).is_ok(), "CALLCHAIN lifts it (and brings PERF_CONTEXT_USER)");
    }
}
