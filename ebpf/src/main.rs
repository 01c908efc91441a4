//! The etm-bpf eBPF program: on each sample of a perf event (cpu-clock/cycles sampling, or the
//! ETM *pause* event), record pid, tid, cpu, time and the user call stack of the target's
//! threads into the `SAMPLES` ring buffer, optionally with LBR/BRBE branch records.
//!
//! Large parts of the record are written in place (the record is bigger than the 512-byte BPF
//! stack): `bpf_get_stack` and `bpf_read_branch_records` write straight into the reserved
//! ring-buffer entry. Whatever has to be dropped is counted in the per-CPU `COUNTERS` map.
//!
//! Built for the host (e.g. by `cargo test --workspace`), the crate is an empty program: the
//! BPF code only exists for `target_arch = "bpf"`.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[cfg(target_arch = "bpf")]
mod prog {
    use core::{
        ffi::c_void,
        mem::offset_of,
        ptr::{addr_of, addr_of_mut},
    };

    use aya_ebpf::{
        EbpfContext,
        bindings::{
            BPF_F_CURRENT_CPU, BPF_F_USER_STACK, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, BPF_RB_RING_SIZE,
        },
        helpers::{
            bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns,
            generated::{
                bpf_get_current_task_btf, bpf_get_stack, bpf_perf_event_output, bpf_probe_read_kernel, bpf_probe_read_user,
                bpf_read_branch_records, bpf_task_pt_regs,
            },
        },
        macros::{map, perf_event, tracepoint},
        maps::{Array, HashMap, PerCpuArray, PerfEventByteArray, RingBuf},
        programs::{PerfEventContext, TracePointContext},
    };
    use etm_bpf_common::{
        BranchEntry, CLONE_THREAD, CONFIG_ENTRIES, CONFIG_FLAGS, CONFIG_STACK_BYTES, CONFIG_TGID, CONFIG_WINDOW_FLAGS,
        COUNTER_BRANCH_EMPTY, COUNTER_BRANCH_ENOENT, COUNTER_BRANCH_ERR, COUNTER_ENTRIES, COUNTER_FILTERED,
        COUNTER_FOREIGN_WINDOWS, COUNTER_FORKS_FOLLOWED, COUNTER_FORKS_LOST, COUNTER_OUTPUT_ERR, COUNTER_PAUSE_IDLE,
        COUNTER_RESUMES, COUNTER_RING_BUSY, COUNTER_RING_FULL, COUNTER_SAMPLES, COUNTER_STACK_ERR, COUNTER_USTACK_ERR,
        COUNTER_USTACK_KERNEL, COUNTER_USTACK_SHORT, COUNTER_WINDOWS, FLAG_FOLLOW_FORKS, FLAG_READ_BRANCHES, FLAG_TGID_SET,
        MAX_BRANCHES, MAX_SLOTS, MAX_STACK_DEPTH, NEWTASK_FLAGS_OFFSET, NEWTASK_PID_OFFSET, PAUSE_HEADER, PAUSE_MAGIC,
        PAUSE_RECORD_SIZE, PAUSE_STACK_ERR, PAUSE_TARGET, PAUSE_USTACK, PauseRecord, PauseStackRecord, REC_HAS_BRANCHES,
        RING_BYTES, RING_WAKEUP_BYTES, SAMPLE_RECORD_SIZE, STACK_SIZES, SampleRecord, StackRecord, TGIDS_MAX, USER_REGS_SIZE,
        USTACK_COPY_ERR, USTACK_MAGIC, USTACK_REGS, USTACK_TASK_REGS, UserRegs, WINDOW_PER_THREAD, WINDOW_UNGATED, WindowState,
        reserve_failed_full,
    };

    #[map]
    static SAMPLES: RingBuf = RingBuf::with_byte_size(RING_BYTES, 0);

    #[map]
    static CONFIG: Array<u32> = Array::with_max_entries(CONFIG_ENTRIES, 0);

    #[map]
    static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_ENTRIES, 0);

    /// The processes to keep with `FLAG_TGID_SET`: tgid -> the profiled process it is or
    /// descends from.
    #[map]
    static TGIDS: HashMap<u32, u32> = HashMap::with_max_entries(TGIDS_MAX, 0);

    const ENOENT: i64 = 2;

    /// Whether samples of process `tgid` are kept: in `TGIDS` with `FLAG_TGID_SET`, else
    /// `CONFIG_TGID` (0: every process).
    #[inline(always)]
    fn wanted(tgid: u32, flags: u32) -> bool {
        if tgid == 0 {
            return false;
        }
        if flags & FLAG_TGID_SET != 0 {
            // SAFETY: the value is only tested for presence, not kept.
            return unsafe { TGIDS.get(&tgid) }.is_some();
        }
        let want = config(CONFIG_TGID);
        want == 0 || tgid == want
    }

    /// On `task:task_newtask` (`copy_process`, in the parent, before the child first runs):
    /// with `FLAG_FOLLOW_FORKS`, a new process (not a thread) whose parent is kept is added
    /// to `TGIDS` with the parent's value, so its first sample is kept.
    #[tracepoint]
    pub fn etm_bpf_fork(ctx: TracePointContext) -> u32 {
        if config(CONFIG_FLAGS) & FLAG_FOLLOW_FORKS == 0 {
            return 0;
        }
        let parent = (bpf_get_current_pid_tgid() >> 32) as u32;
        // SAFETY: the value is copied out at once.
        let Some(root) = (unsafe { TGIDS.get(&parent) }).copied() else { return 0 };
        // SAFETY: reads inside the tracepoint record (offsets checked against its format by
        // user space before attaching).
        let (child, clone_flags) = unsafe {
            (ctx.read_at::<i32>(NEWTASK_PID_OFFSET).unwrap_or(0), ctx.read_at::<u64>(NEWTASK_FLAGS_OFFSET).unwrap_or(0))
        };
        if child <= 0 || clone_flags & CLONE_THREAD != 0 {
            return 0;
        }
        if TGIDS.insert(&(child as u32), &root, 0).is_ok() {
            count(COUNTER_FORKS_FOLLOWED);
        } else {
            count(COUNTER_FORKS_LOST);
        }
        0
    }

    #[inline(always)]
    fn count(idx: u32) {
        if let Some(p) = COUNTERS.get_ptr_mut(idx) {
            // SAFETY: per-CPU slot, the program is not re-entered on the same CPU.
            unsafe { *p += 1 };
        }
    }

    #[inline(always)]
    fn config(idx: u32) -> u32 {
        CONFIG.get(idx).copied().unwrap_or(0)
    }

    #[perf_event]
    pub fn etm_bpf_sample(ctx: PerfEventContext) -> u32 {
        match try_sample(&ctx) {
            Ok(()) | Err(()) => 0,
        }
    }

    #[inline(always)]
    fn try_sample(ctx: &PerfEventContext) -> Result<(), ()> {
        let pid_tgid = bpf_get_current_pid_tgid();
        let tgid = (pid_tgid >> 32) as u32;
        let tid = pid_tgid as u32;
        let flags = config(CONFIG_FLAGS);
        if !wanted(tgid, flags) {
            count(COUNTER_FILTERED);
            return Err(());
        }
        let stack_bytes = config(CONFIG_STACK_BYTES) as usize;
        if stack_bytes == STACK_SIZES[0] {
            sample_with_stack::<{ STACK_SIZES[0] }>(ctx, tgid, tid, flags)
        } else if stack_bytes == STACK_SIZES[1] {
            sample_with_stack::<{ STACK_SIZES[1] }>(ctx, tgid, tid, flags)
        } else if stack_bytes == STACK_SIZES[2] {
            sample_with_stack::<{ STACK_SIZES[2] }>(ctx, tgid, tid, flags)
        } else if stack_bytes == STACK_SIZES[3] {
            sample_with_stack::<{ STACK_SIZES[3] }>(ctx, tgid, tid, flags)
        } else {
            sample_plain(ctx, tgid, tid, flags)
        }
    }

    #[inline(always)]
    fn count_reserve_failure(record: usize) {
        let avail = SAMPLES.query(BPF_RB_AVAIL_DATA as u64);
        let size = SAMPLES.query(BPF_RB_RING_SIZE as u64);
        count(if reserve_failed_full(avail, size, record as u64) { COUNTER_RING_FULL } else { COUNTER_RING_BUSY });
    }

    /// Wake user space only once enough is pending (it also drains on a timer).
    #[inline(always)]
    fn wake_flags() -> u64 {
        (if SAMPLES.query(BPF_RB_AVAIL_DATA as u64) >= RING_WAKEUP_BYTES { BPF_RB_FORCE_WAKEUP } else { BPF_RB_NO_WAKEUP }) as u64
    }

    #[inline(always)]
    fn sample_plain(ctx: &PerfEventContext, tgid: u32, tid: u32, flags: u32) -> Result<(), ()> {
        let Some(mut entry) = SAMPLES.reserve::<SampleRecord>(0) else {
            count_reserve_failure(SAMPLE_RECORD_SIZE);
            return Err(());
        };
        let rec = entry.as_mut_ptr();
        // SAFETY: `rec` points to a reserved entry of size_of::<SampleRecord>() bytes.
        if unsafe { fill_sample(ctx, rec, tgid, tid, flags) }.is_err() {
            entry.discard(0);
            count(COUNTER_STACK_ERR);
            return Err(());
        }
        entry.submit(wake_flags());
        count(COUNTER_SAMPLES);
        Ok(())
    }

    /// A sample with the user registers and the top `N` bytes of the user stack.
    #[inline(always)]
    fn sample_with_stack<const N: usize>(ctx: &PerfEventContext, tgid: u32, tid: u32, flags: u32) -> Result<(), ()> {
        let Some(mut entry) = SAMPLES.reserve::<StackRecord<N>>(0) else {
            count_reserve_failure(core::mem::size_of::<StackRecord<N>>());
            return Err(());
        };
        let rec = entry.as_mut_ptr();
        // SAFETY: `rec` points to a reserved entry of size_of::<StackRecord<N>>() bytes; the
        // sample part is at its start, the registers and stack bytes after it (constant
        // offsets, and copy sizes at most N).
        unsafe {
            if fill_sample(ctx, rec as *mut SampleRecord, tgid, tid, flags).is_err() {
                entry.discard(0);
                count(COUNTER_STACK_ERR);
                return Err(());
            }
            copy_user_stack::<N>(ctx, addr_of_mut!((*rec).regs), (rec as *mut u8).add(offset_of!(StackRecord<N>, bytes)));
        }
        entry.submit(wake_flags());
        count(COUNTER_SAMPLES);
        Ok(())
    }

    /// Writes the user registers ([`read_regs`]) to `regs_dst` and copies the top `N` bytes of
    /// the user stack (from sp up) to `dst`; returns the bytes copied. The one copy of both
    /// programs: samples (`StackRecord`) and pauses (`PauseStackRecord`).
    ///
    /// # Safety
    /// `regs_dst` must point to writable `UserRegs` and `dst` to `N` writable bytes, both at
    /// constant offsets inside one reserved ring entry or map value.
    #[inline(always)]
    unsafe fn copy_user_stack<const N: usize>(ctx: &PerfEventContext, regs_dst: *mut UserRegs, base: *mut u8) -> u32 {
        // SAFETY: the caller's pointers; every write below stays inside `base[..N]` (copy
        // sizes at most N, page offsets masked and compared).
        unsafe {
            let regs = read_regs(ctx);
            let mut r = regs;
            r.size = N as u32;
            if regs.flags & USTACK_REGS == 0 {
                count(COUNTER_USTACK_KERNEL);
            } else {
                let src = regs.sp as *const c_void;
                // N bytes in one read; if that runs past the top of the stack's mapping (sp
                // near it), page by page: from sp to the end of its page, then whole pages
                // until the first that cannot be read.
                let mut copied = 0u32;
                let rest = 4096 - (regs.sp & 4095) as u32;
                if bpf_probe_read_user(base as *mut c_void, N as u32, src) == 0 {
                    copied = N as u32;
                } else if rest <= 4096 && bpf_probe_read_user(base as *mut c_void, rest, src) == 0 {
                    copied = rest;
                    for _ in 0..N / 4096 {
                        // Masked and compared on one value, so the verifier sees the bound.
                        let off = (copied as usize) & (N - 1);
                        if off > N - 4096 || off != copied as usize {
                            break;
                        }
                        let from = regs.sp.wrapping_add(off as u64) as *const c_void;
                        if bpf_probe_read_user(base.add(off) as *mut c_void, 4096, from) != 0 {
                            break;
                        }
                        copied = (off + 4096) as u32;
                    }
                }
                if copied == 0 {
                    r.flags |= USTACK_COPY_ERR;
                    count(COUNTER_USTACK_ERR);
                } else if copied < N as u32 {
                    count(COUNTER_USTACK_SHORT);
                }
                r.copied = copied;
            }
            regs_dst.write(r);
            r.copied
        }
    }

    /// One u64 of kernel memory (0 if unreadable).
    #[inline(always)]
    unsafe fn kread(p: *const u64) -> u64 {
        let mut v = 0u64;
        // SAFETY: the helper checks the source and writes 8 bytes into `v`.
        unsafe { bpf_probe_read_kernel(addr_of_mut!(v) as *mut c_void, 8, p as *const c_void) };
        v
    }

    /// The user registers: the perf context's (`bpf_perf_event_data.regs`, a `pt_regs`) if
    /// the sample interrupted user mode, else the task's user registers saved at its entry
    /// into the kernel (`bpf_task_pt_regs`, flag `USTACK_TASK_REGS`); flags 0 if neither is
    /// user mode.
    #[inline(always)]
    unsafe fn read_regs(ctx: &PerfEventContext) -> UserRegs {
        let regs = ctx.as_ptr() as *const u64;
        let mut r = UserRegs { magic: USTACK_MAGIC, ..UserRegs::default() };
        // SAFETY: constant-offset 8-byte loads inside `bpf_user_pt_regs_t`, the only ctx
        // accesses a perf_event program may make; the task's registers are read with
        // bpf_probe_read_kernel.
        unsafe {
            #[cfg(bpf_target_arch = "x86_64")]
            {
                // struct pt_regs: r15 r14 r13 r12 bp bx r11 r10 r9 r8 ax cx dx si di orig_ax
                // ip cs flags sp ss.
                let cs = core::ptr::read_volatile(regs.add(17));
                if cs & 3 == 3 {
                    r.flags = USTACK_REGS;
                    r.pc = core::ptr::read_volatile(regs.add(16));
                    r.sp = core::ptr::read_volatile(regs.add(19));
                    r.fp = core::ptr::read_volatile(regs.add(4));
                } else {
                    let t = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const u64;
                    if !t.is_null() && kread(t.add(17)) & 3 == 3 {
                        r.flags = USTACK_REGS | USTACK_TASK_REGS;
                        r.pc = kread(t.add(16));
                        r.sp = kread(t.add(19));
                        r.fp = kread(t.add(4));
                    }
                }
            }
            #[cfg(bpf_target_arch = "aarch64")]
            {
                // struct user_pt_regs: regs[31] sp pc pstate; EL0 when pstate's mode bits are 0.
                let pstate = core::ptr::read_volatile(regs.add(33));
                if pstate & 0xf == 0 {
                    r.flags = USTACK_REGS;
                    r.pc = core::ptr::read_volatile(regs.add(32));
                    r.sp = core::ptr::read_volatile(regs.add(31));
                    r.fp = core::ptr::read_volatile(regs.add(29));
                    r.lr = core::ptr::read_volatile(regs.add(30));
                } else {
                    let t = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const u64;
                    if !t.is_null() && kread(t.add(33)) & 0xf == 0 {
                        r.flags = USTACK_REGS | USTACK_TASK_REGS;
                        r.pc = kread(t.add(32));
                        r.sp = kread(t.add(31));
                        r.fp = kread(t.add(29));
                        r.lr = kread(t.add(30));
                    }
                }
            }
        }
        r
    }

    /// Writes the sample part of a reserved record: ids, time, the frame-pointer user stack
    /// and the branch records. `Err` if `bpf_get_stack` gave no frame.
    #[inline(always)]
    unsafe fn fill_sample(ctx: &PerfEventContext, rec: *mut SampleRecord, tgid: u32, tid: u32, flags: u32) -> Result<(), ()> {
        // SAFETY: `rec` points to at least size_of::<SampleRecord>() reserved bytes; every
        // write below stays inside it (offsets and sizes are compile-time constants).
        unsafe {
            let stack_ptr = (rec as *mut u8).add(offset_of!(SampleRecord, stack)) as *mut c_void;
            let n = bpf_get_stack(ctx.as_ptr(), stack_ptr, (MAX_STACK_DEPTH * 8) as u32, BPF_F_USER_STACK as u64);
            if n <= 0 {
                return Err(());
            }
            addr_of_mut!((*rec).pid).write(tgid);
            addr_of_mut!((*rec).tid).write(tid);
            addr_of_mut!((*rec).cpu).write(bpf_get_smp_processor_id());
            addr_of_mut!((*rec).time_ns).write(bpf_ktime_get_ns());
            addr_of_mut!((*rec).stack_len).write((n as u32) / 8);

            let mut rec_flags = 0u32;
            let mut nbranch = 0u32;
            if flags & FLAG_READ_BRANCHES != 0 {
                let br_ptr = (rec as *mut u8).add(offset_of!(SampleRecord, branches)) as *mut c_void;
                let r = bpf_read_branch_records(
                    ctx.as_ptr().cast(),
                    br_ptr,
                    (MAX_BRANCHES * core::mem::size_of::<BranchEntry>()) as u32,
                    0,
                );
                if r >= 0 {
                    rec_flags |= REC_HAS_BRANCHES;
                    nbranch = (r as u32) / core::mem::size_of::<BranchEntry>() as u32;
                    if nbranch == 0 {
                        count(COUNTER_BRANCH_EMPTY);
                    }
                } else if r == -ENOENT {
                    count(COUNTER_BRANCH_ENOENT);
                } else {
                    count(COUNTER_BRANCH_ERR);
                }
            }
            addr_of_mut!((*rec).flags).write(rec_flags);
            addr_of_mut!((*rec).branch_count).write(nbranch);
        }
        Ok(())
    }

    // ---- ETM windows: resume / pause (see etm_bpf_common's module docs) -----------------

    #[map]
    static WINDOWS: Array<WindowState> = Array::with_max_entries(MAX_SLOTS, 0);

    /// Each CPU's bpf-output event (max_entries 0: user space sizes it to the CPU count).
    #[map]
    static PAUSE_OUT: PerfEventByteArray = PerfEventByteArray::new(0);

    /// The record under construction (bigger than the BPF stack).
    #[map]
    static PAUSE_SCRATCH: PerCpuArray<PauseRecord> = PerCpuArray::with_max_entries(1, 0);

    /// The record under construction with a stack copy, one entry per possible CPU (sized by
    /// user space; a per-CPU map's values are limited to 32 KiB, less than the largest copy).
    #[map]
    static PAUSE_STACKS: Array<PauseStackRecord<PAUSE_COPY_MAX>> = Array::with_max_entries(1, 0);

    #[inline(always)]
    fn window_slot() -> u32 {
        if config(CONFIG_WINDOW_FLAGS) & WINDOW_PER_THREAD != 0 {
            0
        } else {
            // SAFETY: a helper without memory arguments.
            unsafe { bpf_get_smp_processor_id() }
        }
    }

    /// On the resume event's overflow (before the kernel resumes the trace): the first
    /// resume after a pause opens the slot's window; further resumes are no-ops, as they are
    /// for the trace (`hw.aux_paused`).
    #[perf_event]
    pub fn etm_bpf_resume(_ctx: PerfEventContext) -> u32 {
        if let Some(st) = WINDOWS.get_ptr_mut(window_slot()) {
            // SAFETY: a valid map value; one writer per slot (the slot's CPU, in NMI context).
            unsafe {
                if (*st).open == 0 {
                    (*st).open = 1;
                    (*st).seq = (*st).seq.wrapping_add(1);
                    (*st).resume_ns = bpf_ktime_get_ns();
                    count(COUNTER_RESUMES);
                }
            }
        }
        0
    }

    /// On the pause event's overflow (after the kernel paused the trace): if this closes an
    /// open window, write its record; otherwise nothing.
    #[perf_event]
    pub fn etm_bpf_pause(ctx: PerfEventContext) -> u32 {
        match try_pause(&ctx) {
            Ok(()) | Err(()) => 0,
        }
    }

    #[inline(always)]
    fn try_pause(ctx: &PerfEventContext) -> Result<(), ()> {
        let st = WINDOWS.get_ptr_mut(window_slot()).ok_or(())?;
        let ungated = config(CONFIG_WINDOW_FLAGS) & WINDOW_UNGATED != 0;
        // SAFETY: a valid map value, written only on this slot's CPU.
        let (seq, resume_ns) = unsafe {
            if ungated {
                // Strobing: every pause samples; `window_ns` is the time since the last one.
                (*st).seq = (*st).seq.wrapping_add(1);
                let prev = (*st).resume_ns;
                (*st).resume_ns = bpf_ktime_get_ns();
                ((*st).seq, prev)
            } else {
                if (*st).open == 0 {
                    count(COUNTER_PAUSE_IDLE);
                    return Err(());
                }
                (*st).open = 0;
                ((*st).seq, (*st).resume_ns)
            }
        };
        // SAFETY: a helper without memory arguments.
        let now = unsafe { bpf_ktime_get_ns() };
        count(COUNTER_WINDOWS);
        let window_ns = now.wrapping_sub(resume_ns);
        let stack_bytes = config(CONFIG_STACK_BYTES) as usize;
        if stack_bytes == STACK_SIZES[0] {
            pause_out::<{ STACK_SIZES[0] }>(ctx, seq, window_ns)
        } else if stack_bytes == STACK_SIZES[1] {
            pause_out::<{ STACK_SIZES[1] }>(ctx, seq, window_ns)
        } else if stack_bytes == STACK_SIZES[2] {
            pause_out::<{ STACK_SIZES[2] }>(ctx, seq, window_ns)
        } else if stack_bytes == STACK_SIZES[3] {
            pause_out::<{ STACK_SIZES[3] }>(ctx, seq, window_ns)
        } else {
            pause_out::<0>(ctx, seq, window_ns)
        }
    }

    /// The largest stack copy a pause record carries (the scratch entries' size).
    const PAUSE_COPY_MAX: usize = STACK_SIZES[STACK_SIZES.len() - 1];

    /// Writes the record of a closed window: the header, for the target the frame-pointer
    /// stack and, with `N > 0`, the user registers and the top `N` bytes of the user stack
    /// (`copy_user_stack`, as for samples), and outputs it.
    #[inline(always)]
    fn pause_out<const N: usize>(ctx: &PerfEventContext, seq: u32, window_ns: u64) -> Result<(), ()> {
        let rec: *mut PauseRecord = if N == 0 {
            PAUSE_SCRATCH.get_ptr_mut(0).ok_or(())?
        } else {
            // SAFETY: a helper without memory arguments.
            let cpu = unsafe { bpf_get_smp_processor_id() };
            PAUSE_STACKS.get_ptr_mut(cpu).ok_or(())? as *mut PauseRecord
        };
        let pid_tgid = bpf_get_current_pid_tgid();
        let tgid = (pid_tgid >> 32) as u32;
        let want = config(CONFIG_TGID);
        let mut flags = 0u32;
        let mut len = PAUSE_HEADER as u64;
        let max_len =
            if N == 0 { core::mem::size_of::<PauseRecord>() } else { core::mem::size_of::<PauseStackRecord<PAUSE_COPY_MAX>>() }
                as u64;
        // SAFETY: `rec` is this CPU's scratch value: a PauseRecord (N = 0) or a
        // PauseStackRecord<PAUSE_COPY_MAX> (N <= PAUSE_COPY_MAX); the stack write is bounded
        // by the array size, the copy by N and the output by the value size.
        unsafe {
            addr_of_mut!((*rec).magic).write(PAUSE_MAGIC);
            addr_of_mut!((*rec).pid).write(tgid);
            addr_of_mut!((*rec).tid).write(pid_tgid as u32);
            addr_of_mut!((*rec).window_ns).write(window_ns);
            addr_of_mut!((*rec).seq).write(seq);
            addr_of_mut!((*rec).stack_len).write(0);
            if tgid != 0 && (want == 0 || tgid == want) {
                flags |= PAUSE_TARGET;
                let stack_ptr = (rec as *mut u8).add(PAUSE_HEADER) as *mut c_void;
                let n = bpf_get_stack(ctx.as_ptr(), stack_ptr, (MAX_STACK_DEPTH * 8) as u32, BPF_F_USER_STACK as u64);
                if n > 0 && n <= (MAX_STACK_DEPTH * 8) as i64 {
                    addr_of_mut!((*rec).stack_len).write((n as u32) / 8);
                    len += n as u64;
                } else {
                    flags |= PAUSE_STACK_ERR;
                    count(COUNTER_STACK_ERR);
                }
                if N > 0 {
                    let full = rec as *mut PauseStackRecord<PAUSE_COPY_MAX>;
                    let copied = copy_user_stack::<N>(
                        ctx,
                        addr_of_mut!((*full).regs),
                        (full as *mut u8).add(offset_of!(PauseStackRecord<PAUSE_COPY_MAX>, bytes)),
                    );
                    flags |= PAUSE_USTACK;
                    len = (PAUSE_RECORD_SIZE + USER_REGS_SIZE) as u64 + (copied as u64).min(N as u64);
                }
            } else {
                count(COUNTER_FOREIGN_WINDOWS);
            }
            addr_of_mut!((*rec).flags).write(flags);
            if len > max_len {
                return Err(());
            }
            let r = bpf_perf_event_output(
                ctx.as_ptr(),
                addr_of!(PAUSE_OUT) as *mut c_void,
                BPF_F_CURRENT_CPU,
                rec as *mut c_void,
                len,
            );
            if r < 0 {
                count(COUNTER_OUTPUT_ERR);
            }
        }
        Ok(())
    }

    #[cfg(not(test))]
    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo) -> ! {
        loop {}
    }

    #[unsafe(link_section = "license")]
    #[unsafe(no_mangle)]
    static LICENSE: [u8; 4] = *b"GPL\0";
}
