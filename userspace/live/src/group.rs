//! One event group (one CPU, or one thread), opened in the order the kernel requires.
//!
//! 1. `perf_event_open` the leader (disabled) and its siblings (`group_fd` = leader);
//! 2. `mmap` the leader: user page + data ring, then the AUX area (`aux_offset`/`aux_size`
//!    written into the user page first, `perf_mmap`);
//! 3. `PERF_EVENT_IOC_SET_OUTPUT` every sibling into the leader's ring — only now:
//!    `perf_event_set_output()` (kernel/events/core.c) starts at `-EINVAL` and takes
//!    `ring_buffer_get(output_event)`, and an event has no ring until it is mapped;
//! 4. the per-CPU bpf-output event (the pause program's records) is opened and redirected into
//!    the same ring (same CPU, same clock: the checks of `perf_event_set_output()`), and
//!    registered in the BPF program's `PERF_EVENT_ARRAY`;
//! 5. the resume and pause programs are attached to their events (`PERF_EVENT_IOC_SET_BPF`);
//! 6. [`LiveGroup::enable`] enables the leader (the siblings follow it) and the bpf-output
//!    event; [`LiveGroup::disable`] stops the group, which makes the sink publish its data
//!    (`etm_event_stop(PERF_EF_UPDATE)` → `update_buffer`).
//!
//! The same code opens cs_etm groups and their software stand-ins
//! ([`etm_perf::attr::GroupPlan::stand_in`]), which is how it runs against the real kernel
//! in the tests.

use std::io;
use std::os::fd::OwnedFd;

use etm_perf::attr::{EventRole, GroupPlan, bpf_output_attr};

use crate::ring::RingSource;
use crate::stream::{CpuStream, IdRole};
use crate::sys::{self, PerfBuffer};

/// What to open.
#[derive(Debug, Clone)]
pub struct GroupSpec {
    /// CPU (`-1`: the group follows the thread `pid`).
    pub cpu: i32,
    /// Thread to follow (`-1`: every task on `cpu`).
    pub pid: i32,
    /// The events, leader first.
    pub plan: GroupPlan,
    /// Data ring size in bytes (rounded up to a power of two of pages).
    pub data_bytes: usize,
    /// AUX ring size in bytes (0: no AUX area; rounded up to a power of two of pages).
    pub aux_bytes: usize,
    /// Open the CPU's bpf-output event into this ring (CPU-wide groups).
    pub bpf_output: bool,
}

/// The eBPF side: attaching the window programs and registering bpf-output events (the
/// binary implements it with the loaded object).
pub trait BpfHooks {
    /// Attach the program for `role` (resume or pause) to `fd` (`PERF_EVENT_IOC_SET_BPF`).
    fn attach(&mut self, role: EventRole, cpu: i32, fd: &OwnedFd) -> Result<(), String>;
    /// Put `fd` (CPU `cpu`'s bpf-output event) into the pause program's output map.
    fn register_output(&mut self, cpu: u32, fd: &OwnedFd) -> Result<(), String>;
}

/// Hooks that attach nothing (groups whose windows are read without BPF, in tests).
#[derive(Debug, Default)]
pub struct NoBpf;

impl BpfHooks for NoBpf {
    fn attach(&mut self, _: EventRole, _: i32, _: &OwnedFd) -> Result<(), String> {
        Ok(())
    }
    fn register_output(&mut self, _: u32, _: &OwnedFd) -> Result<(), String> {
        Ok(())
    }
}

/// A step of [`open`] that failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// `perf_event_open` refused an event.
    #[error("perf_event_open({role}, pid {pid}, cpu {cpu})")]
    Open { role: &'static str, pid: i32, cpu: i32, source: io::Error },
    /// The data or AUX mmap failed (often the `perf_event_mlock_kb` limit).
    #[error("mmap of the data/AUX buffers of cpu {cpu} (raise /proc/sys/kernel/perf_event_mlock_kb?)")]
    Mmap { cpu: i32, source: io::Error },
    /// An ioctl failed.
    #[error("{what} (cpu {cpu})")]
    Ioctl { what: &'static str, cpu: i32, source: io::Error },
    /// The BPF hooks failed.
    #[error("eBPF (cpu {cpu}): {msg}")]
    Bpf { cpu: i32, msg: String },
}

fn role_name(r: EventRole) -> &'static str {
    match r {
        EventRole::Etm => "leader",
        EventRole::Resume => "resume",
        EventRole::Pause => "pause",
    }
}

/// An open, mapped group (or, without a leader, one CPU's bpf-output ring: per-thread mode).
pub struct LiveGroup {
    /// CPU (`-1` per-thread).
    pub cpu: i32,
    /// The leader's buffer (the bpf-output event's, for an output ring).
    pub buf: PerfBuffer,
    /// Siblings and the bpf-output event, kept open (closing detaches the BPF programs).
    fds: Vec<(EventRole, bool, OwnedFd)>,
    output: Option<OwnedFd>,
    /// An output ring: nothing to enable but the bpf-output event, which `buf` owns.
    output_only: bool,
}

/// Power-of-two number of pages holding at least `bytes` (0 stays 0).
pub fn pages_for(bytes: usize, page: usize) -> usize {
    if bytes == 0 { 0 } else { bytes.div_ceil(page).next_power_of_two() }
}

/// Opens `spec` in the kernel's order (module docs); returns the group and the stream that
/// drains its buffer.
pub fn open(spec: &GroupSpec, hooks: &mut dyn BpfHooks) -> Result<(LiveGroup, CpuStream), OpenError> {
    let (cpu, pid) = (spec.cpu, spec.pid);
    let open_err = |role, source| OpenError::Open { role, pid, cpu, source };
    let ioctl_err = |what, source| OpenError::Ioctl { what, cpu, source };
    let (_, leader_attr) = spec.plan.events[0];
    let leader = sys::open(&leader_attr, pid, cpu, None).map_err(|e| open_err("leader", e))?;
    let mut sibs = Vec::new();
    for &(role, attr) in &spec.plan.events[1..] {
        let group = spec.plan.pause_in_group.then_some(&leader);
        let fd = sys::open(&attr, pid, cpu, group).map_err(|e| open_err(role_name(role), e))?;
        sibs.push((role, attr, fd));
    }
    let page = sys::page_size();
    let buf = PerfBuffer::map(leader, pages_for(spec.data_bytes, page).max(1), pages_for(spec.aux_bytes, page))
        .map_err(|source| OpenError::Mmap { cpu, source })?;
    let fmt = leader_attr.sample_format();
    let mut ids = vec![(sys::event_id(&buf.fd).map_err(|e| ioctl_err("PERF_EVENT_IOC_ID", e))?, IdRole::Etm, fmt)];
    let mut fds = Vec::new();
    for (role, attr, fd) in sibs {
        sys::set_output(&fd, &buf.fd).map_err(|e| ioctl_err("PERF_EVENT_IOC_SET_OUTPUT", e))?;
        let id = sys::event_id(&fd).map_err(|e| ioctl_err("PERF_EVENT_IOC_ID", e))?;
        ids.push((id, if role == EventRole::Resume { IdRole::Resume } else { IdRole::Pause }, attr.sample_format()));
        fds.push((role, spec.plan.pause_in_group, fd));
    }
    let mut output = None;
    if spec.bpf_output && cpu >= 0 {
        let a = bpf_output_attr();
        let fd = sys::open(&a, -1, cpu, None).map_err(|e| open_err("bpf-output", e))?;
        sys::set_output(&fd, &buf.fd).map_err(|e| ioctl_err("PERF_EVENT_IOC_SET_OUTPUT (bpf-output)", e))?;
        ids.push((sys::event_id(&fd).map_err(|e| ioctl_err("PERF_EVENT_IOC_ID", e))?, IdRole::BpfOutput, a.sample_format()));
        hooks.register_output(cpu as u32, &fd).map_err(|msg| OpenError::Bpf { cpu, msg })?;
        output = Some(fd);
    }
    for (role, _, fd) in &fds {
        hooks.attach(*role, cpu, fd).map_err(|msg| OpenError::Bpf { cpu, msg })?;
    }
    let stream = CpuStream::new(cpu, fmt, &ids, buf.aux().len() as u64);
    Ok((LiveGroup { cpu, buf, fds, output, output_only: false }, stream))
}

/// Opens the bpf-output event of `cpu` with a ring of its own (per-thread mode: the leader
/// follows the thread, `cpu = -1`, and `perf_event_set_output()` refuses cross-CPU
/// redirection), and registers it for the pause program.
pub fn open_output(cpu: i32, data_bytes: usize, hooks: &mut dyn BpfHooks) -> Result<(LiveGroup, CpuStream), OpenError> {
    let a = bpf_output_attr();
    let fd = sys::open(&a, -1, cpu, None).map_err(|source| OpenError::Open { role: "bpf-output", pid: -1, cpu, source })?;
    let page = sys::page_size();
    let buf = PerfBuffer::map(fd, pages_for(data_bytes, page).max(1), 0).map_err(|source| OpenError::Mmap { cpu, source })?;
    let id = sys::event_id(&buf.fd).map_err(|source| OpenError::Ioctl { what: "PERF_EVENT_IOC_ID", cpu, source })?;
    hooks.register_output(cpu as u32, &buf.fd).map_err(|msg| OpenError::Bpf { cpu, msg })?;
    let fmt = a.sample_format();
    let stream = CpuStream::new(cpu, fmt, &[(id, IdRole::BpfOutput, fmt)], 0);
    Ok((LiveGroup { cpu, buf, fds: Vec::new(), output: None, output_only: true }, stream))
}

impl LiveGroup {
    /// Enables the group: the bpf-output event first (so no pause record is refused), then the
    /// leader (its in-group siblings follow it) and any sibling outside the group.
    pub fn enable(&self) -> io::Result<()> {
        if let Some(o) = &self.output {
            sys::ioctl0(o, sys::PERF_EVENT_IOC_ENABLE)?;
        }
        sys::ioctl0(&self.buf.fd, sys::PERF_EVENT_IOC_ENABLE)?;
        if self.output_only {
            return Ok(());
        }
        for (_, in_group, fd) in &self.fds {
            if !in_group {
                sys::ioctl0(fd, sys::PERF_EVENT_IOC_ENABLE)?;
            }
        }
        Ok(())
    }

    /// Disables the group (leader and outside siblings); the bpf-output event stays on.
    pub fn disable(&self) -> io::Result<()> {
        if self.output_only {
            return Ok(());
        }
        for (_, in_group, fd) in &self.fds {
            if !in_group {
                sys::ioctl0(fd, sys::PERF_EVENT_IOC_DISABLE)?;
            }
        }
        sys::ioctl0(&self.buf.fd, sys::PERF_EVENT_IOC_DISABLE)
    }

    /// The fd of the first event with `role`.
    pub fn fd(&self, role: EventRole) -> Option<&OwnedFd> {
        match role {
            EventRole::Etm => Some(&self.buf.fd),
            _ => self.fds.iter().find(|(r, _, _)| *r == role).map(|(_, _, fd)| fd),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ring sizes in bytes become power-of-two page counts (a 64 KiB-page kernel gets the same
    /// bytes, not 16 times more).
    #[test]
    fn pages_from_bytes() {
        assert_eq!(pages_for(4 << 20, 4096), 1024);
        assert_eq!(pages_for(4 << 20, 65536), 64);
        assert_eq!(pages_for(100_000, 4096), 32);
        assert_eq!(pages_for(0, 4096), 0);
        assert_eq!(pages_for(1, 65536), 1);
    }
}

#[cfg(test)]
mod kernel_tests {
    //! On the running kernel (software events): the ordering rules the open sequence follows.

    use super::*;
    use etm_perf::attr::{
        PERF_COUNT_SW_CPU_CLOCK, PERF_COUNT_SW_DUMMY, PERF_TYPE_SOFTWARE, PerfEventAttr, RING_SAMPLE_TYPE, flag,
    };

    fn leader() -> PerfEventAttr {
        let mut a = PerfEventAttr::new(PERF_TYPE_SOFTWARE, PERF_COUNT_SW_DUMMY);
        a.sample_type = RING_SAMPLE_TYPE;
        a.flags = flag::DISABLED | flag::SAMPLE_ID_ALL | flag::EXCLUDE_KERNEL | flag::EXCLUDE_HV;
        a
    }

    fn sibling() -> PerfEventAttr {
        let mut a = PerfEventAttr::new(PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK);
        a.sample_period = 1_000_000;
        a.sample_type = RING_SAMPLE_TYPE;
        a.flags = flag::SAMPLE_ID_ALL | flag::EXCLUDE_KERNEL | flag::EXCLUDE_HV;
        a
    }

    /// `perf_event_set_output()` refuses a target without a ring: SET_OUTPUT of a sibling
    /// into its leader fails with EINVAL before the leader is mapped and succeeds after. This
    /// is why [`open`] maps first (the order the live path used before failed here).
    #[test]
    fn set_output_needs_the_leader_mapped() {
        let l = match sys::open(&leader(), 0, -1, None) {
            Ok(fd) => fd,
            Err(e) => return etm_testutil::skip(format!("perf_event_open(dummy) failed: {e} (perf_event_paranoid?)")),
        };
        let s = sys::open(&sibling(), 0, -1, Some(&l)).expect("sibling in the dummy's group");
        let e = sys::set_output(&s, &l).expect_err("SET_OUTPUT into an unmapped event must fail");
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
        let buf = PerfBuffer::map(l, 1, 0).expect("map the leader");
        sys::set_output(&s, &buf.fd).expect("SET_OUTPUT into the mapped leader");
    }

    /// The whole sequence of [`open`] on the real kernel with a group of stand-ins
    /// (dummy leader, cpu-clock siblings, a bpf-output event): it opens, and the siblings'
    /// records arrive in the leader's ring under their own ids.
    #[test]
    fn open_sequence_with_software_events() {
        let plan = GroupPlan {
            mode: etm_perf::attr::WindowMode::Free,
            events: vec![(EventRole::Etm, leader()), (EventRole::Resume, sibling()), (EventRole::Pause, sibling())],
            trcconfigr: 0,
            pause_in_group: true,
        };
        let spec = GroupSpec { cpu: -1, pid: 0, plan, data_bytes: 64 << 10, aux_bytes: 0, bpf_output: false };
        let (g, mut stream) = match open(&spec, &mut NoBpf) {
            Ok(g) => g,
            Err(OpenError::Open { source, .. }) if source.raw_os_error() == Some(libc::EACCES) => {
                return etm_testutil::skip(format!("perf_event_open refused: {source}"));
            }
            Err(e) => panic!("{e}"),
        };
        g.enable().unwrap();
        // CPU time, not wall time: a loaded machine gives the thread a fraction of the clock.
        etm_testutil::spin_cpu_ms(40, 10);
        g.disable().unwrap();
        let mut g = g;
        let mut n = 0;
        stream.drain(&mut g.buf, &mut |_: etm_session::session::SessionEvent<'_>| n += 1);
        let st = stream.stats;
        assert!(st.resume_samples >= 10 && st.kernel_samples >= 10, "{st:?}");
        assert_eq!((st.unknown_samples, st.bad_records), (0, 0), "{st:?}");
    }
}
