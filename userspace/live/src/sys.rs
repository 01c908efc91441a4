//! The syscalls of the live ETM path: `perf_event_open` for attrs built by `etm_perf::attr`,
//! the perf ioctls, and the data + AUX mmaps (etm-interface.md §1.6).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::AtomicU64;

use etm_perf::attr::PerfEventAttr;
use etm_perf::ring::{UserPage, aux_offset_for, page};

use crate::ring::RingSource;

/// `PERF_FLAG_FD_CLOEXEC`.
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
/// `_IO('$', 0)`.
pub const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
/// `_IO('$', 1)`.
pub const PERF_EVENT_IOC_DISABLE: libc::c_ulong = 0x2401;
/// `_IO('$', 5)`.
pub const PERF_EVENT_IOC_SET_OUTPUT: libc::c_ulong = 0x2405;
/// `_IOR('$', 7, u64)`.
pub const PERF_EVENT_IOC_ID: libc::c_ulong = 0x8008_2407;
/// `_IOW('$', 8, u32)`.
#[cfg(test)] // (the BPF attach is `live::bpf::SampleBpf::attach_perf_fd`)
pub const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;

/// `perf_event_open(attr, pid, cpu, group_fd, FD_CLOEXEC)` with the uapi bytes of `attr`.
pub fn open(attr: &PerfEventAttr, pid: i32, cpu: i32, group: Option<&OwnedFd>) -> io::Result<OwnedFd> {
    let bytes = attr.to_bytes();
    let group_fd = group.map_or(-1, |g| g.as_raw_fd());
    // SAFETY: `bytes` is a complete perf_event_attr of `attr.size` (136) bytes that outlives
    // the call; the other arguments are plain integers.
    let fd = unsafe { libc::syscall(libc::SYS_perf_event_open, bytes.as_ptr(), pid, cpu, group_fd, PERF_FLAG_FD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// An ioctl without argument (ENABLE/DISABLE).
pub fn ioctl0(fd: &OwnedFd, req: libc::c_ulong) -> io::Result<()> {
    // SAFETY: perf ioctl on an fd we own; the argument 0 means "this event only".
    if unsafe { libc::ioctl(fd.as_raw_fd(), req, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `PERF_EVENT_IOC_SET_OUTPUT`: send `fd`'s records to `target`'s ring.
pub fn set_output(fd: &OwnedFd, target: &OwnedFd) -> io::Result<()> {
    // SAFETY: both are perf fds we own.
    if unsafe { libc::ioctl(fd.as_raw_fd(), PERF_EVENT_IOC_SET_OUTPUT, target.as_raw_fd()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `PERF_EVENT_IOC_ID`: the id that PERF_SAMPLE_IDENTIFIER reports for this event.
pub fn event_id(fd: &OwnedFd) -> io::Result<u64> {
    let mut id = 0u64;
    // SAFETY: the kernel writes one u64 through the pointer.
    if unsafe { libc::ioctl(fd.as_raw_fd(), PERF_EVENT_IOC_ID, &mut id as *mut u64) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(id)
}

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory effects.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 { n as usize } else { 4096 }
}

/// An owned shared mapping.
pub struct Mmap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; access goes through atomics (user page) or
// reads of regions the kernel has published and will not rewrite until we move the tail.
unsafe impl Send for Mmap {}

impl Mmap {
    fn new(fd: &OwnedFd, len: usize, offset: u64, prot: libc::c_int) -> io::Result<Mmap> {
        // SAFETY: a fresh shared mapping of a perf fd; the kernel validates len/offset.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd.as_raw_fd(), offset as libc::off_t) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mmap { ptr: p.cast(), len })
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `new` mapped.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The mmap of one ring-owning event: user page + data ring, and the AUX ring if requested.
pub struct PerfBuffer {
    /// The event owning the buffer (the cs_etm leader, or a plain sampling event in tests).
    pub fd: OwnedFd,
    base: Mmap,
    aux: Option<Mmap>,
    data_size: usize,
    page: usize,
}

impl PerfBuffer {
    /// Maps `data_pages` (power of two) of data ring and, if `aux_pages > 0` (power of two),
    /// an AUX ring in normal (writable) mode: user page fields `aux_offset/aux_size` are
    /// written first, then the AUX area is mapped at `aux_offset`.
    pub fn map(fd: OwnedFd, data_pages: usize, aux_pages: usize) -> io::Result<PerfBuffer> {
        let page = page_size();
        let base = Mmap::new(&fd, (1 + data_pages) * page, 0, libc::PROT_READ | libc::PROT_WRITE)?;
        let mut buf = PerfBuffer { fd, base, aux: None, data_size: data_pages * page, page };
        if aux_pages > 0 {
            let off = aux_offset_for(page as u64, data_pages as u64);
            let size = (aux_pages * page) as u64;
            buf.page().set_aux_area(off, size);
            buf.aux = Some(Mmap::new(&buf.fd, size as usize, off, libc::PROT_READ | libc::PROT_WRITE)?);
        }
        Ok(buf)
    }
}

impl RingSource for PerfBuffer {
    fn page(&self) -> UserPage<'_> {
        // SAFETY: the first page of the mapping is the perf_event_mmap_page, page-aligned and
        // at least 4096 bytes; the kernel updates it concurrently, hence atomics.
        let words = unsafe { std::slice::from_raw_parts(self.base.ptr as *const AtomicU64, page::WORDS) };
        UserPage::new(words).expect("page::WORDS words")
    }
    fn data(&self) -> &[u8] {
        // SAFETY: the data ring follows the user page inside the mapping.
        unsafe { std::slice::from_raw_parts(self.base.ptr.add(self.page), self.data_size) }
    }
    fn aux(&self) -> &[u8] {
        match &self.aux {
            // SAFETY: the whole AUX mapping.
            Some(m) => unsafe { std::slice::from_raw_parts(m.ptr, m.len) },
            None => &[],
        }
    }
    fn reenable(&mut self) -> io::Result<()> {
        ioctl0(&self.fd, PERF_EVENT_IOC_ENABLE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::{CpuStream, IdRole};
    use etm_perf::attr::{PERF_TYPE_SOFTWARE, RING_SAMPLE_TYPE, aux_action, flag};
    use etm_perf::records::sample;
    use etm_session::session::{SessionEvent, Sideband};

    /// The ioctl numbers equal the _IO/_IOR/_IOW encodings of linux/perf_event.h ('$' = 0x24).
    #[test]
    fn ioctl_encoding() {
        let io = |dir: u64, nr: u64, size: u64| ((dir << 30) | (size << 16) | (0x24 << 8) | nr) as libc::c_ulong;
        assert_eq!(PERF_EVENT_IOC_ENABLE, io(0, 0, 0));
        assert_eq!(PERF_EVENT_IOC_SET_OUTPUT, io(0, 5, 0));
        assert_eq!(PERF_EVENT_IOC_ID, io(2, 7, 8));
        assert_eq!(PERF_EVENT_IOC_SET_BPF, io(1, 8, 4));
    }

    fn software_attr(st: u64) -> PerfEventAttr {
        let mut a = PerfEventAttr::new(PERF_TYPE_SOFTWARE, 1 /* TASK_CLOCK */);
        a.sample_period = 200_000; // ns of task clock
        a.sample_type = st;
        a.flags = flag::SAMPLE_ID_ALL
            | flag::MMAP
            | flag::MMAP2
            | flag::COMM
            | flag::COMM_EXEC
            | flag::TASK
            | flag::EXCLUDE_KERNEL
            | flag::EXCLUDE_HV
            | flag::EXCLUDE_CALLCHAIN_KERNEL;
        a.sample_max_stack = 64;
        a
    }

    /// On the running kernel: a software event opened from our attr bytes, mapped with our
    /// buffer code and drained with the same stream code as cs_etm, yields its samples
    /// (counted) and the MMAP2 of a file we map executable, whose time agrees with the
    /// user-page clock conversion of the CPU counter. (No AUX: no AUX PMU here.)
    #[test]
    fn live_kernel_data_ring() {
        let attr = software_attr(RING_SAMPLE_TYPE | sample::CALLCHAIN);
        let fd = match open(&attr, 0, -1, None) {
            Ok(fd) => fd,
            Err(e) => {
                etm_testutil::skip(format!("perf_event_open(task-clock) failed: {e} (perf_event_paranoid / container)"));
                return;
            }
        };
        let id = event_id(&fd).unwrap();
        let mut buf = PerfBuffer::map(fd, 8, 0).unwrap();
        let fmt = attr.sample_format();
        let mut s = CpuStream::new(-1, fmt, &[(id, IdRole::Pause, fmt)], 0);
        // Work: spin, and map an executable file (our own test binary) to get an MMAP2.
        let exe = std::env::current_exe().unwrap();
        let f = std::fs::File::open(&exe).unwrap();
        // SAFETY: read-only private mapping of a file we opened; unmapped below.
        let m = unsafe {
            libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_EXEC, libc::MAP_PRIVATE, f.as_raw_fd(), 0)
        };
        assert_ne!(m, libc::MAP_FAILED);
        // CPU time, not wall time: a loaded machine gives the thread a fraction of the clock.
        etm_testutil::spin_cpu_ms(60, 10);
        ioctl0(&buf.fd, PERF_EVENT_IOC_DISABLE).unwrap();
        let mut mmaps = Vec::new();
        s.drain(&mut buf, &mut |ev: SessionEvent<'_>| {
            if let SessionEvent::Sideband(Sideband::Mmap2 { filename, prot, time, pid, .. }) = ev {
                mmaps.push((filename.clone(), *prot, *time, *pid))
            }
        });
        // SAFETY: unmapping the mapping made above.
        unsafe { libc::munmap(m, 4096) };
        // The event's own samples are counted, not forwarded (pause samples come from the
        // pause program's bpf-output records).
        assert!(s.stats.kernel_samples >= 10, "only {} samples ({:?})", s.stats.kernel_samples, s.stats);
        let exe_s = exe.to_string_lossy().into_owned();
        let me = std::process::id();
        let mm = mmaps.iter().find(|(f, prot, _, pid)| *f == exe_s && prot & libc::PROT_EXEC as u32 != 0 && *pid == me);
        let (_, _, mm_time, _) = mm.unwrap_or_else(|| panic!("no exec MMAP2 of {exe_s}: {mmaps:?}"));
        assert_eq!(s.stats.bad_records, 0);
        assert_eq!(buf.page().data_tail(), buf.page().data_head());
        // Clock: the user-page conversion of the counter read now is after the MMAP2's
        // sample_id time (both the perf clock).
        match crate::clock::perf_now(&buf.page()) {
            Some(now) => {
                assert!(now >= *mm_time && now - mm_time < 5_000_000_000, "perf now {now} vs MMAP2 at {mm_time}");
            }
            // Without cap_user_time_zero (x86 guests without a stable native sched_clock) the
            // perf clock cannot be read from user space: the conversion must refuse, not guess.
            None => {
                use etm_perf::ring::page;
                let caps = buf.page().load_u64(page::CAPABILITIES, std::sync::atomic::Ordering::Acquire);
                assert_eq!(
                    caps & page::CAP_USER_TIME_ZERO,
                    0,
                    "the page offers cap_user_time_zero but no perf time came out of it"
                );
            }
        }
    }

    /// Hardware cycles sampling events overflow at their periods: alone, and two in one group
    /// at different periods (what the free-running window mode relies on): the samples in the
    /// ring match the events' own counts divided by their periods within 20%. Where the
    /// kernel has no core PMU (this x86 VM: no `cpu` or `armv8_pmuv3*` in event_source), the
    /// hardware event must fail to open instead.
    #[test]
    fn live_kernel_hw_cycles_overflow_at_their_period() {
        use etm_perf::attr::{PERF_COUNT_HW_CPU_CYCLES, PERF_TYPE_HARDWARE};
        let has_pmu = std::fs::read_dir("/sys/bus/event_source/devices")
            .map(|d| {
                d.flatten().any(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n == "cpu" || n.starts_with("cpu_") || n.starts_with("armv8_pmuv3") || n.starts_with("armv9_")
                })
            })
            .unwrap_or(false);
        let cycles = |period: u64, disabled: bool| {
            let mut a = PerfEventAttr::new(PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES);
            a.sample_period = period;
            a.sample_type = RING_SAMPLE_TYPE;
            a.flags = flag::SAMPLE_ID_ALL | flag::EXCLUDE_KERNEL | flag::EXCLUDE_HV | if disabled { flag::DISABLED } else { 0 };
            a
        };
        let first = open(&cycles(200_001, true), 0, -1, None);
        if !has_pmu {
            let e = first.expect_err("no core PMU, yet a hardware cycles event opened");
            assert!(matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) | Some(libc::ENODEV)), "{e}");
            return;
        }
        let read_count = |fd: &OwnedFd| {
            let mut v = 0u64;
            // SAFETY: reading 8 bytes (read_format 0: the count) into a u64.
            let n = unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
            assert_eq!(n, 8, "read count: {}", io::Error::last_os_error());
            v
        };
        let spin = || {
            let t0 = std::time::Instant::now();
            let mut x = 0u64;
            while t0.elapsed().as_millis() < 300 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(std::hint::black_box(1));
            }
            std::hint::black_box(x);
        };
        let drain = |buf: &mut PerfBuffer, ids: &[u64]| {
            let fmt = cycles(1, false).sample_format();
            let roles: Vec<_> = ids.iter().map(|&i| (i, IdRole::Pause, fmt)).collect();
            let mut st = CpuStream::new(-1, fmt, &roles, 0);
            st.drain(buf, &mut |_: SessionEvent<'_>| {});
            st.stats
        };
        // Alone.
        let fd = first.expect("a hardware cycles event opens where the kernel has a PMU");
        let id = event_id(&fd).unwrap();
        let mut buf = PerfBuffer::map(fd, 64, 0).unwrap();
        ioctl0(&buf.fd, PERF_EVENT_IOC_ENABLE).unwrap();
        spin();
        ioctl0(&buf.fd, PERF_EVENT_IOC_DISABLE).unwrap();
        let count = read_count(&buf.fd);
        let st = drain(&mut buf, &[id]);
        let want = count as f64 / 200_001.0;
        assert_eq!(st.throttles, 0, "{st:?}");
        assert!(
            (st.kernel_samples as f64 - want).abs() <= want * 0.2 + 3.0,
            "alone: {} samples, {count} cycles / 200001 = {want:.0}",
            st.kernel_samples
        );
        // Two in a group, different periods.
        let lead = open(&cycles(200_001, true), 0, -1, None).unwrap();
        let sib = open(&cycles(1_000_003, false), 0, -1, Some(&lead)).unwrap();
        let ids = [event_id(&lead).unwrap(), event_id(&sib).unwrap()];
        let mut buf = PerfBuffer::map(lead, 64, 0).unwrap();
        set_output(&sib, &buf.fd).unwrap();
        ioctl0(&buf.fd, PERF_EVENT_IOC_ENABLE).unwrap();
        spin();
        ioctl0(&buf.fd, PERF_EVENT_IOC_DISABLE).unwrap();
        let (c1, c2) = (read_count(&buf.fd), read_count(&sib));
        let st = drain(&mut buf, &ids);
        let want = c1 as f64 / 200_001.0 + c2 as f64 / 1_000_003.0;
        assert!(
            (st.kernel_samples as f64 - want).abs() <= want * 0.2 + 3.0,
            "grouped: {} samples, {c1} / 200001 + {c2} / 1000003 = {want:.0}",
            st.kernel_samples
        );
        // CPU-wide on this CPU under a dummy leader (the ETM stand-in group's shape), where
        // privileges allow (root).
        // SAFETY: sched_getcpu has no arguments; the set is zeroed and sized.
        let cpu = unsafe {
            let cpu = libc::sched_getcpu().max(0);
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu as usize, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            cpu
        };
        let mut dummy = PerfEventAttr::new(PERF_TYPE_SOFTWARE, 9 /* DUMMY */);
        dummy.sample_type = RING_SAMPLE_TYPE;
        dummy.flags = flag::SAMPLE_ID_ALL | flag::DISABLED | flag::EXCLUDE_KERNEL | flag::EXCLUDE_HV;
        let Ok(lead) = open(&dummy, -1, cpu, None) else { return };
        let a = open(&cycles(200_001, false), -1, cpu, Some(&lead)).unwrap();
        let b = open(&cycles(1_000_003, false), -1, cpu, Some(&lead)).unwrap();
        let ids = [event_id(&lead).unwrap(), event_id(&a).unwrap(), event_id(&b).unwrap()];
        let mut buf = PerfBuffer::map(lead, 64, 0).unwrap();
        set_output(&a, &buf.fd).unwrap();
        set_output(&b, &buf.fd).unwrap();
        ioctl0(&buf.fd, PERF_EVENT_IOC_ENABLE).unwrap();
        spin();
        ioctl0(&buf.fd, PERF_EVENT_IOC_DISABLE).unwrap();
        let (c1, c2) = (read_count(&a), read_count(&b));
        let st = drain(&mut buf, &ids);
        let want = c1 as f64 / 200_001.0 + c2 as f64 / 1_000_003.0;
        assert!(
            (st.kernel_samples as f64 - want).abs() <= want * 0.2 + 3.0,
            "CPU-wide under a dummy leader: {} samples, {c1} / 200001 + {c2} / 1000003 = {want:.0}",
            st.kernel_samples
        );
    }

    /// The running kernel reads the aux_action word at offset 116: a software event with
    /// aux_pause (no AUX group leader) or aux_start_paused (no AUX PMU) is refused, the same
    /// attr without it opens.
    #[test]
    fn live_kernel_rejects_misplaced_aux_action() {
        let base = software_attr(RING_SAMPLE_TYPE);
        if let Err(e) = open(&base, 0, -1, None) {
            etm_testutil::skip(format!("perf_event_open failed: {e}"));
            return;
        }
        for act in [aux_action::PAUSE, aux_action::RESUME, aux_action::START_PAUSED] {
            let a = PerfEventAttr { aux_action: act, ..base };
            let e = open(&a, 0, -1, None).expect_err("aux_action must be refused on a software event");
            assert!(matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::EOPNOTSUPP)), "{act}: {e}");
        }
    }
}
