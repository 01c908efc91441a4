//! Loading the etm-bpf eBPF object and attaching its sampling program to perf events.
//!
//! [`SampleBpf::load`] loads the object built by `build.rs`, configures the target tgid and
//! flags, and loads the `perf_event` program. [`SampleBpf::attach_perf_fd`] attaches it to any
//! perf event fd the caller opened (cpu-clock/cycles sampling here, the ETM *pause* event in
//! the live-ETM path) with `PERF_EVENT_IOC_SET_BPF` + `PERF_EVENT_IOC_ENABLE`; the fd is kept
//! open for the life of the `SampleBpf` (closing it detaches the program).

use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd};

use anyhow::{Context as _, anyhow};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
    programs::{PerfEvent, TracePoint},
};
use etm_bpf_common::{
    CONFIG_FLAGS, CONFIG_MAP, CONFIG_TGID, CONFIG_WINDOW_FLAGS, COUNTER_BRANCH_EMPTY, COUNTER_BRANCH_ENOENT, COUNTER_BRANCH_ERR,
    COUNTER_ENTRIES, COUNTER_FILTERED, COUNTER_FOREIGN_WINDOWS, COUNTER_OUTPUT_ERR, COUNTER_PAUSE_IDLE, COUNTER_RESUMES,
    COUNTER_RING_BUSY, COUNTER_RING_FULL, COUNTER_SAMPLES, COUNTER_STACK_ERR, COUNTER_WINDOWS, COUNTERS_MAP, FORK_PROGRAM,
    NEWTASK_FLAGS_OFFSET, NEWTASK_PID_OFFSET, PAUSE_OUT_MAP, PAUSE_PROGRAM, PROGRAM_NAME, RESUME_PROGRAM, SAMPLES_MAP, TGIDS_MAP,
};
use etm_perf::attr::EventRole;

/// The eBPF object built from `ebpf/` by `build.rs`.
pub static OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/etm-bpf"));

const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;

/// Kernel-side counters, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BpfCounters {
    /// Samples written to the ring buffer.
    pub samples: u64,
    /// Samples dropped: ring buffer full.
    pub ring_full: u64,
    /// Samples dropped: the reservation failed with room in the ring (contention).
    pub ring_busy: u64,
    /// Samples dropped: `bpf_get_stack` failed.
    pub stack_err: u64,
    /// `bpf_read_branch_records` failed (sample kept).
    pub branch_err: u64,
    /// `bpf_read_branch_records` returned -ENOENT (no branch stack).
    pub branch_enoent: u64,
    /// `bpf_read_branch_records` returned no entry (sample kept, empty branch stack).
    pub branch_empty: u64,
    /// Samples of other processes skipped by the tgid filter.
    pub filtered: u64,
    /// ETM windows closed by a pause (records written or attempted).
    pub windows: u64,
    /// Pauses that closed no window.
    pub pause_idle: u64,
    /// Windows closed in another process.
    pub foreign_windows: u64,
    /// Pause records `bpf_perf_event_output` could not write.
    pub output_err: u64,
    /// Resumes that opened a window.
    pub resumes: u64,
    /// Stack copies (`--unwind dwarf|auto`) that failed at every size (sample kept).
    pub ustack_err: u64,
    /// Samples taken in the kernel, without user registers to copy (sample kept).
    pub ustack_kernel: u64,
    /// Stack copies shortened at the top of the stack's mapping.
    pub ustack_short: u64,
    /// New processes the fork program added to the filter (`--follow-children`).
    pub forks_followed: u64,
    /// New processes it could not add (the filter map was full).
    pub forks_lost: u64,
}

impl BpfCounters {
    /// Samples the kernel side had to drop.
    pub fn dropped(&self) -> u64 {
        self.ring_full + self.ring_busy + self.stack_err
    }
}

/// The loaded sampler: object, program, maps and the perf fds it is attached to.
pub struct SampleBpf {
    ebpf: Ebpf,
    attached: Vec<OwnedFd>,
}

impl SampleBpf {
    /// Loads the object and the program; keeps samples of process `tgid` only (0: all) and
    /// sets the `FLAG_*` bits in `flags`.
    #[cfg(test)]
    pub fn load(tgid: u32, flags: u32) -> anyhow::Result<SampleBpf> {
        SampleBpf::load_with_stack(tgid, flags, 0, etm_bpf_common::RING_BYTES)
    }

    /// [`SampleBpf::load`] copying `stack_bytes` of the user stack and the user registers
    /// into each record (one of `STACK_SIZES`, or 0), with a sample ring of `ring_bytes` (a
    /// power of two, at least a page).
    pub fn load_with_stack(tgid: u32, flags: u32, stack_bytes: u32, ring_bytes: u32) -> anyhow::Result<SampleBpf> {
        raise_memlock_limit();
        // One pause record with a stack copy under construction per possible CPU (the pause
        // program indexes them by CPU number); one entry when nothing is copied.
        let cpus = if stack_bytes == 0 { 1 } else { aya::util::nr_cpus().map_or(etm_bpf_common::MAX_SLOTS, |n| n as u32) };
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(etm_bpf_common::SAMPLES_MAP, ring_bytes)
            .map_max_entries(etm_bpf_common::PAUSE_STACKS_MAP, cpus)
            .load(OBJ)
            .context("cannot load the eBPF object (is BPF available to this process?)")?;
        {
            let mut config: Array<&mut MapData, u32> =
                Array::try_from(ebpf.map_mut(CONFIG_MAP).ok_or_else(|| anyhow!("map {CONFIG_MAP} missing"))?)?;
            config.set(CONFIG_TGID, tgid, 0).context("set target tgid")?;
            config.set(CONFIG_FLAGS, flags, 0).context("set flags")?;
            config.set(etm_bpf_common::CONFIG_STACK_BYTES, stack_bytes, 0).context("set the stack copy size")?;
        }
        let prog: &mut PerfEvent =
            ebpf.program_mut(PROGRAM_NAME).ok_or_else(|| anyhow!("program {PROGRAM_NAME} missing"))?.try_into()?;
        prog.load().context("the kernel rejected the eBPF sampling program")?;
        Ok(SampleBpf { ebpf, attached: Vec::new() })
    }

    /// Loads the ETM window programs (resume, pause) for process `tgid` with `WINDOW_*`
    /// `flags`; [`etm_live::group::BpfHooks`] then attaches them to a group's events.
    /// With `stack_bytes` (one of `STACK_SIZES`, or 0) each target window's record also
    /// carries the user registers and that much of the top of the user stack
    /// (`etm_bpf_common::PauseStackRecord`), for DWARF unwinding.
    pub fn load_windows(tgid: u32, flags: u32, stack_bytes: u32) -> anyhow::Result<SampleBpf> {
        let mut bpf = SampleBpf::load_with_stack(tgid, 0, stack_bytes, etm_bpf_common::RING_BYTES)?;
        {
            let mut config: Array<&mut MapData, u32> =
                Array::try_from(bpf.ebpf.map_mut(CONFIG_MAP).ok_or_else(|| anyhow!("map {CONFIG_MAP} missing"))?)?;
            config.set(CONFIG_WINDOW_FLAGS, flags, 0).context("set window flags")?;
        }
        for name in [RESUME_PROGRAM, PAUSE_PROGRAM] {
            let prog: &mut PerfEvent = bpf.ebpf.program_mut(name).ok_or_else(|| anyhow!("program {name} missing"))?.try_into()?;
            prog.load().with_context(|| format!("the kernel rejected the eBPF program {name}"))?;
        }
        Ok(bpf)
    }

    /// The kernel's run count and total run time (ns) of program `name` (counted while
    /// `kernel.bpf_stats_enabled` or an `aya::sys::enable_stats` fd is on).
    #[cfg(test)]
    pub fn run_stats(&self, name: &str) -> anyhow::Result<(u64, u64)> {
        let prog: &PerfEvent = self.ebpf.program(name).ok_or_else(|| anyhow!("program {name} missing"))?.try_into()?;
        let info = prog.info()?;
        Ok((info.run_count(), info.run_time().as_nanos() as u64))
    }

    /// Sets the `WINDOW_*` flags of the window programs (before the groups are enabled).
    pub fn set_window_flags(&mut self, flags: u32) -> anyhow::Result<()> {
        let mut config: Array<&mut MapData, u32> =
            Array::try_from(self.ebpf.map_mut(CONFIG_MAP).ok_or_else(|| anyhow!("map {CONFIG_MAP} missing"))?)?;
        config.set(CONFIG_WINDOW_FLAGS, flags, 0).context("set window flags")?;
        Ok(())
    }

    fn program_fd(&self, name: &str) -> anyhow::Result<OwnedFd> {
        let prog: &PerfEvent = self.ebpf.program(name).ok_or_else(|| anyhow!("program {name} missing"))?.try_into()?;
        Ok(prog.fd()?.as_fd().try_clone_to_owned()?)
    }

    /// The window programs and the pause program's output map as fds of their own (the
    /// kernel objects stay alive while these are open): what opening a group, now or when a
    /// throttled one is opened anew, needs.
    pub fn window_programs(&self) -> anyhow::Result<WindowPrograms> {
        let map = self.ebpf.map(PAUSE_OUT_MAP).ok_or_else(|| anyhow!("map {PAUSE_OUT_MAP} missing"))?;
        let aya::maps::Map::PerfEventArray(data) = map else { anyhow::bail!("{PAUSE_OUT_MAP} is not a PERF_EVENT_ARRAY") };
        Ok(WindowPrograms {
            resume: self.program_fd(RESUME_PROGRAM)?,
            pause: self.program_fd(PAUSE_PROGRAM)?,
            out_map: data.fd().as_fd().try_clone_to_owned()?,
        })
    }

    /// Attaches the program to the perf event `fd` and enables the event. The fd is kept open
    /// (and the program attached) until `self` is dropped.
    pub fn attach_perf_fd(&mut self, fd: OwnedFd) -> anyhow::Result<()> {
        let prog: &PerfEvent =
            self.ebpf.program(PROGRAM_NAME).ok_or_else(|| anyhow!("program {PROGRAM_NAME} missing"))?.try_into()?;
        let prog_fd = prog.fd()?.as_fd().as_raw_fd();
        // SAFETY: ioctl on a perf fd we own with an int argument (the program fd).
        if unsafe { libc::ioctl(fd.as_raw_fd(), PERF_EVENT_IOC_SET_BPF, prog_fd) } < 0 {
            return Err(std::io::Error::last_os_error()).context("PERF_EVENT_IOC_SET_BPF");
        }
        super::perf_event::enable(&fd).context("PERF_EVENT_IOC_ENABLE")?;
        self.attached.push(fd);
        Ok(())
    }

    /// Stops sampling on every attached event (the fds stay open until drop).
    pub fn disable_all(&self) {
        for fd in &self.attached {
            let _ = super::perf_event::disable(fd);
        }
    }

    /// Takes the sample ring buffer (once).
    pub fn take_ring(&mut self) -> anyhow::Result<RingBuf<MapData>> {
        let map = self.ebpf.take_map(SAMPLES_MAP).ok_or_else(|| anyhow!("map {SAMPLES_MAP} missing or already taken"))?;
        Ok(RingBuf::try_from(map)?)
    }

    /// Reads the kernel-side counters (summed over CPUs).
    pub fn counters(&self) -> anyhow::Result<BpfCounters> {
        let map = self.ebpf.map(COUNTERS_MAP).ok_or_else(|| anyhow!("map {COUNTERS_MAP} missing"))?;
        let arr: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(map)?;
        let mut v = [0u64; COUNTER_ENTRIES as usize];
        for (i, slot) in v.iter_mut().enumerate() {
            *slot = arr.get(&(i as u32), 0)?.iter().sum();
        }
        Ok(BpfCounters {
            samples: v[COUNTER_SAMPLES as usize],
            ring_full: v[COUNTER_RING_FULL as usize],
            ring_busy: v[COUNTER_RING_BUSY as usize],
            branch_empty: v[COUNTER_BRANCH_EMPTY as usize],
            stack_err: v[COUNTER_STACK_ERR as usize],
            branch_err: v[COUNTER_BRANCH_ERR as usize],
            branch_enoent: v[COUNTER_BRANCH_ENOENT as usize],
            filtered: v[COUNTER_FILTERED as usize],
            windows: v[COUNTER_WINDOWS as usize],
            pause_idle: v[COUNTER_PAUSE_IDLE as usize],
            foreign_windows: v[COUNTER_FOREIGN_WINDOWS as usize],
            output_err: v[COUNTER_OUTPUT_ERR as usize],
            resumes: v[COUNTER_RESUMES as usize],
            ustack_err: v[etm_bpf_common::COUNTER_USTACK_ERR as usize],
            ustack_kernel: v[etm_bpf_common::COUNTER_USTACK_KERNEL as usize],
            ustack_short: v[etm_bpf_common::COUNTER_USTACK_SHORT as usize],
            forks_followed: v[etm_bpf_common::COUNTER_FORKS_FOLLOWED as usize],
            forks_lost: v[etm_bpf_common::COUNTER_FORKS_LOST as usize],
        })
    }

    fn tgids(&mut self) -> anyhow::Result<BpfHashMap<&mut MapData, u32, u32>> {
        let map = self.ebpf.map_mut(TGIDS_MAP).ok_or_else(|| anyhow!("map {TGIDS_MAP} missing"))?;
        Ok(BpfHashMap::try_from(map)?)
    }

    /// Keeps the samples of process `tgid` (with `FLAG_TGID_SET`), as part of the profile of
    /// process `root`.
    pub fn add_tgid(&mut self, tgid: u32, root: u32) -> anyhow::Result<()> {
        self.tgids()?.insert(tgid, root, 0).with_context(|| format!("cannot add process {tgid} to the filter"))
    }

    /// Stops keeping the samples of process `tgid` (it exited).
    pub fn remove_tgid(&mut self, tgid: u32) {
        if let Ok(mut m) = self.tgids() {
            let _ = m.remove(&tgid);
        }
    }

    /// The profiled process whose profile `tgid`'s samples belong to, if the filter keeps it.
    pub fn tgid_root(&mut self, tgid: u32) -> Option<u32> {
        self.tgids().ok()?.get(&tgid, 0).ok()
    }

    /// Every process the filter keeps, with its root.
    pub fn kept_tgids(&mut self) -> Vec<(u32, u32)> {
        self.tgids().map(|m| m.iter().filter_map(Result::ok).collect()).unwrap_or_default()
    }

    /// Loads the fork program and attaches it to `task:task_newtask` (`--follow-children`;
    /// set `FLAG_FOLLOW_FORKS` at load). The tracepoint's record layout is checked first.
    pub fn attach_fork(&mut self) -> anyhow::Result<()> {
        let format = NEWTASK_FORMATS.iter().find_map(|p| std::fs::read_to_string(p).ok()).ok_or_else(|| {
            anyhow!(
                "--follow-children needs the task:task_newtask tracepoint, and tracefs is not mounted \
                     (mount -t tracefs nodev /sys/kernel/tracing)"
            )
        })?;
        check_newtask_format(&format).map_err(|e| anyhow!("--follow-children: {e}"))?;
        let prog: &mut TracePoint =
            self.ebpf.program_mut(FORK_PROGRAM).ok_or_else(|| anyhow!("program {FORK_PROGRAM} missing"))?.try_into()?;
        prog.load().context("the kernel rejected the eBPF fork program")?;
        prog.attach("task", "task_newtask").context("cannot attach the fork program to task:task_newtask")?;
        Ok(())
    }
}

/// Where the `task:task_newtask` format is (tracefs, or tracefs under debugfs).
const NEWTASK_FORMATS: [&str; 2] =
    ["/sys/kernel/tracing/events/task/task_newtask/format", "/sys/kernel/debug/tracing/events/task/task_newtask/format"];

/// Checks that the tracepoint record has the `pid` and 8-byte `clone_flags` fields at the
/// offsets the fork program reads (`NEWTASK_PID_OFFSET`, `NEWTASK_FLAGS_OFFSET`).
pub fn check_newtask_format(format: &str) -> Result<(), String> {
    let field = |name: &str| {
        format.lines().find_map(|l| {
            let decl = l.trim().strip_prefix("field:")?.split(';').next()?;
            if decl.rsplit(' ').next()? != name {
                return None;
            }
            let num = |key: &str| l.split(key).nth(1)?.split(';').next()?.trim().parse::<usize>().ok();
            Some((num("offset:")?, num("size:")?))
        })
    };
    let want = [("pid", NEWTASK_PID_OFFSET, 4), ("clone_flags", NEWTASK_FLAGS_OFFSET, 8)];
    for (name, offset, size) in want {
        match field(name) {
            Some((o, s)) if o == offset && s == size => {}
            Some((o, s)) => {
                return Err(format!(
                    "task:task_newtask's {name} field is at offset {o} (size {s}), not {offset} (size {size}) as the fork program reads it"
                ));
            }
            None => return Err(format!("task:task_newtask has no {name} field")),
        }
    }
    Ok(())
}

/// `BPF_MAP_UPDATE_ELEM` (the `bpf(2)` command number).
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;

/// `union bpf_attr` for the map element commands (`map_fd`, `key`, `value`, `flags`).
#[repr(C)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// The loaded window programs (module docs), as owned fds.
pub struct WindowPrograms {
    resume: OwnedFd,
    pause: OwnedFd,
    out_map: OwnedFd,
}

impl etm_live::group::BpfHooks for WindowPrograms {
    /// `PERF_EVENT_IOC_SET_BPF` with the resume or pause program; the group's enable starts
    /// the event (the fd stays with the group).
    fn attach(&mut self, role: EventRole, _cpu: i32, fd: &OwnedFd) -> Result<(), String> {
        let prog = match role {
            EventRole::Resume => &self.resume,
            EventRole::Pause => &self.pause,
            EventRole::Etm => return Ok(()),
        };
        // SAFETY: ioctl on a perf fd the caller owns with an int argument (the program fd).
        if unsafe { libc::ioctl(fd.as_raw_fd(), PERF_EVENT_IOC_SET_BPF, prog.as_raw_fd()) } < 0 {
            return Err(format!("PERF_EVENT_IOC_SET_BPF ({role:?}): {}", std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Stores the bpf-output event's fd at index `cpu` of the `PERF_EVENT_ARRAY`.
    fn register_output(&mut self, cpu: u32, fd: &OwnedFd) -> Result<(), String> {
        let key: u32 = cpu;
        let value: u32 = fd.as_raw_fd() as u32;
        let attr = MapElemAttr {
            map_fd: self.out_map.as_raw_fd() as u32,
            _pad: 0,
            key: &key as *const u32 as u64,
            value: &value as *const u32 as u64,
            flags: 0,
        };
        // SAFETY: bpf(BPF_MAP_UPDATE_ELEM) reads `attr` (size given) and the key/value it
        // points to, all alive for the call.
        let r = unsafe {
            libc::syscall(libc::SYS_bpf, BPF_MAP_UPDATE_ELEM, &attr as *const MapElemAttr, std::mem::size_of::<MapElemAttr>())
        };
        if r < 0 {
            return Err(format!("adding the bpf-output event of cpu {cpu}: {}", std::io::Error::last_os_error()));
        }
        Ok(())
    }
}

/// Lifts RLIMIT_MEMLOCK for kernels that still charge BPF maps against it (< 5.11).
fn raise_memlock_limit() {
    let rlim = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: plain setrlimit with a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) } != 0 {
        log::debug!("setrlimit(RLIMIT_MEMLOCK) failed: {}", std::io::Error::last_os_error());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The format of 6.x kernels (`u64 clone_flags`) and of older ones (`unsigned long`)
    /// passes; a moved field is refused with a sentence naming it.
    #[test]
    fn newtask_format_is_checked() {
        let f = "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
                 \tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
                 \tfield:pid_t pid;\toffset:8;\tsize:4;\tsigned:1;\n\
                 \tfield:char comm[16];\toffset:12;\tsize:16;\tsigned:0;\n\
                 \tfield:u64 clone_flags;\toffset:32;\tsize:8;\tsigned:0;\n";
        assert_eq!(check_newtask_format(f), Ok(()));
        assert_eq!(check_newtask_format(&f.replace("u64 clone_flags", "unsigned long clone_flags")), Ok(()));
        let moved = f.replace("offset:32;", "offset:40;");
        assert!(check_newtask_format(&moved).unwrap_err().contains("clone_flags field is at offset 40"));
        assert!(check_newtask_format("").unwrap_err().contains("no pid field"));
        if let Ok(real) = std::fs::read_to_string(NEWTASK_FORMATS[0]) {
            assert_eq!(check_newtask_format(&real), Ok(()), "{real}");
        }
    }
    use crate::live::perf_event::{SampleEvent, perf_event_open, sampling_attr};
    use etm_bpf_common::{FLAG_READ_BRANCHES, SampleRecord};
    use etm_perf::attr::flag;

    fn can_bpf() -> bool {
        let ok = crate::cmd::run::check_privileges().is_ok();
        if !ok {
            etm_testutil::skip("needs CAP_BPF + CAP_PERFMON or CAP_SYS_ADMIN (run as root)");
        }
        ok
    }

    fn thread_cpu_ms() -> u64 {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: valid out-pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
    }

    /// Spins until this thread used `ms` of CPU (not wall) time, or 30 s passed.
    #[inline(never)]
    fn busy_loop(ms: u64) -> u64 {
        let (t, c0) = (std::time::Instant::now(), thread_cpu_ms());
        let mut x = 0u64;
        while thread_cpu_ms() - c0 < ms && t.elapsed().as_secs() < 30 {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        }
        x
    }

    /// The branch event's attr on a software event: same flag word (exclude bits, precise_ip),
    /// cpu-clock instead of cycles and no branch stack (`cpu_clock_event_init` refuses one).
    fn cpu_clock_stand_in(mut a: etm_perf::attr::PerfEventAttr) -> etm_perf::attr::PerfEventAttr {
        a.ty = etm_perf::attr::PERF_TYPE_SOFTWARE;
        a.config = crate::live::perf_event::PERF_COUNT_SW_CPU_CLOCK;
        a.sample_type &= !crate::live::perf_event::PERF_SAMPLE_BRANCH_STACK;
        a.branch_sample_type = 0;
        a
    }

    /// Spins in the kernel (reads of /dev/zero: `clear_user`) until `ms` of CPU passed; returns
    /// (user, system) microseconds this thread used meanwhile.
    fn kernel_loop(ms: u64) -> (u64, u64) {
        use std::io::Read as _;
        let ru = || {
            // SAFETY: valid out-pointer.
            let mut r: libc::rusage = unsafe { std::mem::zeroed() };
            unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut r) };
            let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
            (us(r.ru_utime), us(r.ru_stime))
        };
        let mut f = std::fs::File::open("/dev/zero").unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let (u0, s0) = ru();
        let (t, c0) = (std::time::Instant::now(), thread_cpu_ms());
        while thread_cpu_ms() - c0 < ms && t.elapsed().as_secs() < 30 {
            let _ = f.read(&mut buf);
        }
        let (u1, s1) = ru();
        (u1 - u0, s1 - s0)
    }

    /// Samples the program sees on this thread with `attr` during a kernel-heavy loop, and the
    /// loop's (user, system) time.
    fn samples_during_kernel_loop(attr: &etm_perf::attr::PerfEventAttr) -> (u64, (u64, u64)) {
        let mut bpf = SampleBpf::load(std::process::id(), 0).expect("load");
        let fd = perf_event_open(attr, 0, -1).expect("cpu-clock on this thread");
        bpf.attach_perf_fd(fd).expect("attach");
        let times = kernel_loop(400);
        bpf.disable_all();
        (bpf.counters().unwrap().samples, times)
    }

    /// On the real kernel: the branch event's exclude bits stop sampling in the kernel
    /// (`perf_swevent_hrtimer` -> `perf_exclude_event`, the same test the PMU drivers make in
    /// hardware). A loop spending most of its time in `read(/dev/zero)` gets its samples
    /// without the bits, and only its user share with them.
    #[test]
    fn branch_event_flags_exclude_kernel_samples_on_the_kernel() {
        if !can_bpf() {
            return;
        }
        let branch = sampling_attr(SampleEvent::Cycles, 999, true);
        let with = cpu_clock_stand_in(branch);
        let mut without = with;
        without.flags &= !(flag::EXCLUDE_KERNEL | flag::EXCLUDE_HV);
        let (n_all, (u, s)) = samples_during_kernel_loop(&without);
        let (n_user, (u2, s2)) = samples_during_kernel_loop(&with);
        let kernel_share = |u: u64, s: u64| s as f64 / (u + s).max(1) as f64;
        assert!(kernel_share(u, s) > 0.7 && kernel_share(u2, s2) > 0.7, "loop not kernel-bound: {u}/{s} {u2}/{s2} us");
        assert!(n_all >= 100, "only {n_all} samples without exclusion");
        assert!((n_user as f64) < 0.5 * n_all as f64, "exclude_kernel kept {n_user} of {n_all} samples");
    }

    /// On the real kernel: a sampling event with precise_ip refuses our program (it calls
    /// `bpf_get_stack`) with EPROTO unless the callchain is sampled
    /// (`perf_event_set_bpf_handler`); the pinned attr has no precise_ip and attaches.
    #[test]
    fn precise_ip_refuses_the_program_on_the_kernel() {
        if !can_bpf() {
            return;
        }
        let base = cpu_clock_stand_in(sampling_attr(SampleEvent::Cycles, 999, true));
        let mut bpf = SampleBpf::load(std::process::id(), 0).expect("load");
        let mut precise = base;
        precise.flags |= 2 << flag::PRECISE_IP_SHIFT;
        let fd = perf_event_open(&precise, 0, -1).expect("cpu-clock with precise_ip opens");
        let err = bpf.attach_perf_fd(fd).expect_err("precise_ip without callchain must refuse the program");
        let io = err.downcast_ref::<std::io::Error>().expect("an io error");
        assert_eq!(io.raw_os_error(), Some(libc::EPROTO), "{err:#}");
        let mut chain = precise;
        chain.sample_type |= crate::live::perf_event::PERF_SAMPLE_CALLCHAIN;
        bpf.attach_perf_fd(perf_event_open(&chain, 0, -1).unwrap()).expect("with CALLCHAIN it attaches");
        bpf.attach_perf_fd(perf_event_open(&base, 0, -1).unwrap()).expect("the pinned attr attaches");
    }

    /// On the real kernel: with nobody draining, the ring takes as many records as
    /// `bpf_ringbuf_has_space` allows ((size - 1) / 1824), and every later reservation counts
    /// as ring full, none as contention (one thread, no other producer).
    #[test]
    fn full_ring_counts_full_not_busy() {
        if !can_bpf() {
            return;
        }
        let mut bpf = SampleBpf::load(std::process::id(), 0).expect("load");
        let attr = sampling_attr(SampleEvent::CpuClock, 5000, false);
        let fd = perf_event_open(&attr, 0, -1).expect("cpu-clock on this thread");
        bpf.attach_perf_fd(fd).expect("attach");
        let rec = etm_bpf_common::SAMPLE_RECORD_SIZE as u64;
        let fits = (u64::from(etm_bpf_common::RING_BYTES) - 1) / ((rec + 8 + 7) & !7);
        let t = std::time::Instant::now();
        while bpf.counters().unwrap().ring_full < 50 && t.elapsed().as_secs() < 30 {
            busy_loop(100);
        }
        bpf.disable_all();
        let c = bpf.counters().unwrap();
        assert_eq!(c.samples, fits, "{c:?}");
        assert!(c.ring_full >= 50, "{c:?}");
        assert_eq!(c.ring_busy, 0, "{c:?}");
    }

    /// On the real kernel: a per-thread event opened with `inherit` (what
    /// `open_per_thread` opens, here on cpu-clock) follows threads created after it was
    /// opened, and they run the BPF program too (`inherit_event` copies the program): the
    /// new thread's samples reach the ring with its tid.
    #[test]
    fn inherited_per_thread_events_carry_the_program() {
        if !can_bpf() {
            return;
        }
        let mut attr = cpu_clock_stand_in(sampling_attr(SampleEvent::Cycles, 999, true));
        attr.flags |= flag::INHERIT;
        let mut bpf = SampleBpf::load(std::process::id(), 0).expect("load");
        let fd = perf_event_open(&attr, 0, -1).expect("cpu-clock on this thread, inherited");
        bpf.attach_perf_fd(fd).expect("attach");
        let child = std::thread::spawn(|| {
            busy_loop(300);
            // SAFETY: gettid has no arguments.
            unsafe { libc::gettid() as u32 }
        })
        .join()
        .unwrap();
        bpf.disable_all();
        let mut ring = bpf.take_ring().unwrap();
        let mut of_child = 0;
        while let Some(item) = ring.next() {
            if SampleRecord::from_bytes(&item).is_some_and(|r| r.tid == child) {
                of_child += 1;
            }
        }
        assert!(of_child >= 100, "only {of_child} samples of the thread created after the event");
    }

    /// The program attached to our own perf fd (cpu-clock on this thread) records samples of
    /// this process with a user stack, and with branch reading on but no branch stack on the
    /// event (this VM, or any cpu-clock event) it counts the failure and still keeps samples.
    #[test]
    fn attach_to_own_fd_records_samples_and_counts_branch_failures() {
        if !can_bpf() {
            return;
        }
        let pid = std::process::id();
        let mut bpf = SampleBpf::load(pid, FLAG_READ_BRANCHES).expect("load");
        let attr = sampling_attr(SampleEvent::CpuClock, 999, false);
        let fd = perf_event_open(&attr, 0, -1).expect("cpu-clock on this thread");
        bpf.attach_perf_fd(fd).expect("attach");
        busy_loop(300);
        bpf.disable_all();
        let mut ring = bpf.take_ring().unwrap();
        let mut n = 0;
        while let Some(item) = ring.next() {
            let rec = SampleRecord::from_bytes(&item).expect("full record");
            assert_eq!(rec.pid, pid);
            assert!(!rec.stack().is_empty());
            assert!(rec.branches().is_empty());
            n += 1;
        }
        let c = bpf.counters().unwrap();
        // 300 ms of CPU at 999 Hz is ~300 samples; allow for timer slack on a loaded VM.
        assert!(n >= 100, "only {n} samples in 300 ms of CPU at 999 Hz");
        assert_eq!(c.samples, n);
        assert_eq!(c.branch_enoent + c.branch_err, n, "{c:?}");
        assert_eq!(c.dropped(), 0);
    }
}
