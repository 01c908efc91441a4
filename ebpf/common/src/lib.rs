//! Records and map layouts shared by the etm-bpf eBPF program and user space.
//!
//! `no_std`, `#[repr(C)]`, no pointers: the kernel side writes these bytes into a `RingBuf`
//! (large parts in place, because a [`SampleRecord`] is bigger than the 512-byte BPF stack) and
//! user space reads them back with [`SampleRecord::from_bytes`]. With feature `user` the types
//! implement `aya::Pod` so they can also be read from maps.
//!
//! ## Timestamps
//! [`SampleRecord::time_ns`] is `bpf_ktime_get_ns()`, i.e. `CLOCK_MONOTONIC` (without suspend
//! time). perf's own sample times use `local_clock()` (sched_clock) unless the event is opened
//! with `use_clockid = 1, clockid = CLOCK_MONOTONIC`; code that joins these records with perf
//! records (AUX data, sideband) must open its perf events with that clock, or convert.
#![no_std]

/// Maximum number of user stack frames captured per sample (leaf first).
pub const MAX_STACK_DEPTH: usize = 127;
/// Maximum number of branch records (LBR/BRBE via `bpf_read_branch_records`) per sample: as
/// many as the deepest unit gives (BRBE implements 8, 16, 32 or 64 records,
/// `brbe_num_branch_records`; Intel LBR and Arch LBR at most 32).
pub const MAX_BRANCHES: usize = 64;

/// Name of the eBPF program (a `perf_event` program) in the object.
pub const PROGRAM_NAME: &str = "etm_bpf_sample";
/// Name of the `RingBuf` map carrying [`SampleRecord`]s.
pub const SAMPLES_MAP: &str = "SAMPLES";
/// Name of the `Array<u32>` configuration map, indexed by `CONFIG_*`.
pub const CONFIG_MAP: &str = "CONFIG";
/// Name of the `PerCpuArray<u64>` counter map, indexed by `COUNTER_*`.
pub const COUNTERS_MAP: &str = "COUNTERS";

/// Size of the sample ring buffer in bytes (power-of-two multiple of the page size).
pub const RING_BYTES: u32 = 4 << 20;
/// Records are submitted without waking user space until this many bytes are pending (user
/// space also drains on a short timer): one wake-up per ~280 samples instead of per sample.
pub const RING_WAKEUP_BYTES: u64 = (RING_BYTES / 8) as u64;

/// `CONFIG[CONFIG_TGID]`: the process (thread-group) id to keep; 0 keeps every process.
pub const CONFIG_TGID: u32 = 0;
/// `CONFIG[CONFIG_FLAGS]`: a bit set of `FLAG_*`.
pub const CONFIG_FLAGS: u32 = 1;
/// Number of entries in the configuration map.
pub const CONFIG_ENTRIES: u32 = 4;

/// Config flag: read branch records with `bpf_read_branch_records` for each sample.
pub const FLAG_READ_BRANCHES: u32 = 1;
/// Config flag: keep the samples of the processes in [`TGIDS_MAP`] (instead of
/// `CONFIG[CONFIG_TGID]`).
pub const FLAG_TGID_SET: u32 = 2;
/// Config flag: the fork program adds each new process (not thread) whose parent is in
/// [`TGIDS_MAP`] to it, with the parent's value (the profiled process it descends from).
pub const FLAG_FOLLOW_FORKS: u32 = 4;

/// Name of the `HashMap<u32, u32>` of the processes to keep (`FLAG_TGID_SET`): tgid -> the
/// profiled process it is, or descends from (`run --pid A,B`, `--follow-children`).
pub const TGIDS_MAP: &str = "TGIDS";
/// Entries of [`TGIDS_MAP`] (user space removes processes that exited).
pub const TGIDS_MAX: u32 = 8192;
/// Name of the tracepoint program on `task:task_newtask` (`--follow-children`).
pub const FORK_PROGRAM: &str = "etm_bpf_fork";
/// `task:task_newtask`'s record: offset of `pid_t pid` (the new task's id).
pub const NEWTASK_PID_OFFSET: usize = 8;
/// `task:task_newtask`'s record: offset of the 8-byte `clone_flags`.
pub const NEWTASK_FLAGS_OFFSET: usize = 32;
/// `CLONE_THREAD` (a new thread of the same process, not a new process).
pub const CLONE_THREAD: u64 = 0x0001_0000;

/// `CONFIG[CONFIG_STACK_BYTES]`: bytes of the user stack (from the sampled stack pointer up)
/// to copy into each record with the user registers, for DWARF unwinding in user space; one
/// of [`STACK_SIZES`], 0 for none (frame-pointer stacks only).
pub const CONFIG_STACK_BYTES: u32 = 3;
/// The stack copy sizes the program supports (each a constant-size ring reservation, as the
/// verifier wants; [`StackRecord`] of that size).
pub const STACK_SIZES: [usize; 4] = [4 << 10, 8 << 10, 16 << 10, 32 << 10];
/// The default stack copy size (`run --stack-size`).
pub const DEFAULT_STACK_BYTES: usize = 16 << 10;

/// Counter: samples of the target that were written to the ring buffer.
pub const COUNTER_SAMPLES: u32 = 0;
/// Counter: samples dropped because the ring buffer was full ([`reserve_failed_full`]).
pub const COUNTER_RING_FULL: u32 = 1;
/// Counter: samples dropped because `bpf_get_stack` failed (or returned no frame).
pub const COUNTER_STACK_ERR: u32 = 2;
/// Counter: `bpf_read_branch_records` failed (sample kept, without branches).
pub const COUNTER_BRANCH_ERR: u32 = 3;
/// Counter: `bpf_read_branch_records` returned -ENOENT (no branch stack on this event/CPU).
pub const COUNTER_BRANCH_ENOENT: u32 = 4;
/// Counter: samples of other processes that the tgid filter skipped.
pub const COUNTER_FILTERED: u32 = 5;
/// Counter: stack copies that failed at every size tried (record kept without the copy).
pub const COUNTER_USTACK_ERR: u32 = 13;
/// Counter: samples taken in the kernel without user registers (neither the perf context's
/// nor the task's saved ones are user mode; record kept without the copy).
pub const COUNTER_USTACK_KERNEL: u32 = 14;
/// Counter: stack copies that were shortened (the full size ran past the stack's mapping).
pub const COUNTER_USTACK_SHORT: u32 = 15;
/// Counter: new processes the fork program added to [`TGIDS_MAP`].
pub const COUNTER_FORKS_FOLLOWED: u32 = 16;
/// Counter: new processes the fork program could not add ([`TGIDS_MAP`] full).
pub const COUNTER_FORKS_LOST: u32 = 17;
/// Number of counters in the counter map.
pub const COUNTER_ENTRIES: u32 = 18;

/// `BPF_RINGBUF_HDR_SZ`: the header before each ring-buffer record.
pub const RINGBUF_HDR_SZ: u64 = 8;

/// Why a `bpf_ringbuf_reserve` of `record` bytes failed, judged from what
/// `bpf_ringbuf_query` says just after (`avail` = `BPF_RB_AVAIL_DATA`, producer minus consumer
/// position; `ring_size` = `BPF_RB_RING_SIZE`): `true` if the ring is full, i.e. the new
/// record would put the producer more than `ring_size - 1` ahead of the consumer, the test
/// `bpf_ringbuf_has_space` makes (kernel/bpf/ringbuf.c). Otherwise the reservation failed for
/// another reason of `__bpf_ringbuf_reserve`: the ring's spin lock was not taken
/// (`raw_res_spin_lock_irqsave` fails on contention timeout or re-entry, e.g. an NMI on a CPU
/// inside a reservation) or an older uncommitted record of another CPU spans the ring
/// (`new_prod_pos - pend_pos > mask`): contention, not a slow consumer. The query races with
/// the consumer, so a ring drained in between counts as contended.
pub const fn reserve_failed_full(avail: u64, ring_size: u64, record: u64) -> bool {
    let len = (record + RINGBUF_HDR_SZ + 7) & !7;
    avail.saturating_add(len) > ring_size.saturating_sub(1)
}

/// Counter: `bpf_read_branch_records` returned 0 bytes (the event has a branch stack, but no
/// entry): kept as a branch sample with an empty stack.
pub const COUNTER_BRANCH_EMPTY: u32 = 11;
/// Counter: samples dropped because `bpf_ringbuf_reserve` failed with room in the ring
/// (lock contention or another CPU's record in flight: [`reserve_failed_full`]).
pub const COUNTER_RING_BUSY: u32 = 12;

// ---------------------------------------------------------------------------------------
// The ETM pause/resume programs (`etm_bpf_resume`, `etm_bpf_pause`).
//
// The resume program runs on the overflow of the resume event, before the kernel resumes the
// trace (`__perf_event_overflow`: BPF first, `perf_event_aux_pause(.., false)` at `out:`); it
// marks the window of its slot open. The pause program runs after the kernel paused the
// trace; only if it closes an open window does it capture the user stack (or, for another
// process, a header without stack) and write a [`PauseRecord`] with `bpf_perf_event_output`
// into the slot CPU's bpf-output event. That event is redirected into the cs_etm leader's
// data ring, so the kernel stamps the record in the perf clock (`perf_prepare_sample`), and
// in ring order after the pause's own PERF_RECORD_AUX. Pauses that close no window cost a map
// lookup. Both programs return 0 (no kernel sample; the pause and resume still happen).
// ---------------------------------------------------------------------------------------

/// Name of the resume program (a `perf_event` program).
pub const RESUME_PROGRAM: &str = "etm_bpf_resume";
/// Name of the pause program (a `perf_event` program).
pub const PAUSE_PROGRAM: &str = "etm_bpf_pause";
/// Name of the `PerCpuArray`-like `Array<WindowState>` map, indexed by slot.
pub const WINDOWS_MAP: &str = "WINDOWS";
/// Name of the `PERF_EVENT_ARRAY` map holding each CPU's bpf-output event.
pub const PAUSE_OUT_MAP: &str = "PAUSE_OUT";
/// Number of window slots (CPU numbers in CPU-wide mode; slot 0 in per-thread mode).
pub const MAX_SLOTS: u32 = 4096;

/// `CONFIG[CONFIG_WINDOW_FLAGS]`: `WINDOW_*` bits for the pause/resume programs.
pub const CONFIG_WINDOW_FLAGS: u32 = 2;
/// Window flag: one event group follows one thread (per-thread mode): every CPU uses slot 0.
pub const WINDOW_PER_THREAD: u32 = 1;
/// Window flag: no resume event (strobing: the ETM opens and closes windows itself); every
/// pause captures.
pub const WINDOW_UNGATED: u32 = 2;

/// The state of one window slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowState {
    /// 1 while a window is open (a resume ran and no pause since).
    pub open: u32,
    /// Windows opened in this slot so far.
    pub seq: u32,
    /// `bpf_ktime_get_ns()` at the resume that opened the window.
    pub resume_ns: u64,
}

/// [`PauseRecord::magic`].
pub const PAUSE_MAGIC: u32 = 0x5045_544d; // "MTEP"
/// [`PauseRecord::flags`]: the window closed in the target process; `stack` is valid.
pub const PAUSE_TARGET: u32 = 1;
/// [`PauseRecord::flags`]: `bpf_get_stack` failed (target sample without stack).
pub const PAUSE_STACK_ERR: u32 = 2;
/// [`PauseRecord::flags`]: the record carries the user registers and a copy of the top of
/// the user stack after the whole [`PauseRecord`] (a [`PauseStackRecord`], `--unwind
/// dwarf|auto`): [`PauseHeader::user_stack`].
pub const PAUSE_USTACK: u32 = 4;
/// Bytes of a [`PauseRecord`] before its stack.
pub const PAUSE_HEADER: usize = 32;
/// Name of the `Array` map holding each CPU's [`PauseStackRecord`] under construction (its
/// entries, one per possible CPU, are sized by user space).
pub const PAUSE_STACKS_MAP: &str = "PAUSE_STACKS";

/// What the pause program writes for each window it closes. Only `PAUSE_HEADER + 8 *
/// stack_len` bytes are written.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PauseRecord {
    /// [`PAUSE_MAGIC`].
    pub magic: u32,
    /// `PAUSE_*` flags.
    pub flags: u32,
    /// Thread-group id of the task the pause interrupted.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// `bpf_ktime_get_ns()` at the pause minus at the resume that opened the window: the
    /// window's length (one clock, so the NTP slew of CLOCK_MONOTONIC does not matter).
    pub window_ns: u64,
    /// [`WindowState::seq`] of the window (gaps show lost records).
    pub seq: u32,
    /// Valid entries in `stack`.
    pub stack_len: u32,
    /// User stack, leaf first.
    pub stack: [u64; MAX_STACK_DEPTH],
}

/// Size of a full [`PauseRecord`].
pub const PAUSE_RECORD_SIZE: usize = core::mem::size_of::<PauseRecord>();

/// A pause record with the user registers and a copy of the top `N` bytes of the user stack,
/// as [`StackRecord`] is for samples: the whole [`PauseRecord`] (its `stack` array in full,
/// `stack_len` entries valid), then [`UserRegs`], then the copy. Only `PAUSE_RECORD_SIZE +
/// USER_REGS_SIZE + copied` bytes are output.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PauseStackRecord<const N: usize> {
    pub pause: PauseRecord,
    pub regs: UserRegs,
    pub bytes: [u8; N],
}

/// Bytes one pause record takes in the perf ring's PERF_SAMPLE_RAW with a copy of `copied`
/// bytes (0 without a copy: the header and `stack_len` frames).
pub const fn pause_raw_bytes(stack_len: usize, copied: Option<usize>) -> usize {
    match copied {
        Some(c) => PAUSE_RECORD_SIZE + USER_REGS_SIZE + c,
        None => PAUSE_HEADER + 8 * stack_len,
    }
}

/// A [`PauseRecord`] read back from the `PERF_SAMPLE_RAW` payload of a bpf-output sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PauseHeader {
    pub flags: u32,
    pub pid: u32,
    pub tid: u32,
    pub window_ns: u64,
    pub seq: u32,
    pub stack_len: u32,
}

impl PauseHeader {
    /// Parses the header of a raw payload (which may carry the kernel's alignment padding)
    /// and returns it with the stack bytes; `None` if it is not a pause record or the stack
    /// does not fit.
    pub fn parse(raw: &[u8]) -> Option<(PauseHeader, &[u8])> {
        let u32_at = |o: usize| raw.get(o..o + 4).map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
        if u32_at(0)? != PAUSE_MAGIC {
            return None;
        }
        let w = raw.get(16..24)?;
        let h = PauseHeader {
            flags: u32_at(4)?,
            pid: u32_at(8)?,
            tid: u32_at(12)?,
            window_ns: u64::from_ne_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]),
            seq: u32_at(24)?,
            stack_len: u32_at(28)?,
        };
        let n = (h.stack_len as usize).min(MAX_STACK_DEPTH);
        let stack = raw.get(PAUSE_HEADER..PAUSE_HEADER + 8 * n)?;
        Some((h, stack))
    }

    /// The user registers and the stack copy of a raw payload whose header has
    /// [`PAUSE_USTACK`] (after the whole [`PauseRecord`]); `None` without them. The copy is
    /// clamped to the bytes present.
    pub fn user_stack(raw: &[u8]) -> Option<(UserRegs, &[u8])> {
        let (h, _) = PauseHeader::parse(raw)?;
        if h.flags & PAUSE_USTACK == 0 {
            return None;
        }
        UserRegs::parse_at(raw, PAUSE_RECORD_SIZE)
    }

    /// Writes the bytes the pause program outputs for this header and `stack` (its first
    /// `stack_len` entries) into `out`; returns their number (`None` if `out` is too short).
    pub fn encode(&self, stack: &[u64], out: &mut [u8]) -> Option<usize> {
        let n = (self.stack_len as usize).min(stack.len()).min(MAX_STACK_DEPTH);
        let len = PAUSE_HEADER + 8 * n;
        let out = out.get_mut(..len)?;
        out[0..4].copy_from_slice(&PAUSE_MAGIC.to_ne_bytes());
        out[4..8].copy_from_slice(&self.flags.to_ne_bytes());
        out[8..12].copy_from_slice(&self.pid.to_ne_bytes());
        out[12..16].copy_from_slice(&self.tid.to_ne_bytes());
        out[16..24].copy_from_slice(&self.window_ns.to_ne_bytes());
        out[24..28].copy_from_slice(&self.seq.to_ne_bytes());
        out[28..32].copy_from_slice(&(n as u32).to_ne_bytes());
        for (i, a) in stack[..n].iter().enumerate() {
            out[PAUSE_HEADER + 8 * i..PAUSE_HEADER + 8 * i + 8].copy_from_slice(&a.to_ne_bytes());
        }
        Some(len)
    }

    /// [`PauseHeader::encode`] of a record with [`PAUSE_USTACK`]: the whole [`PauseRecord`],
    /// then `regs` (`copied` set to the length of `copy`) and `copy`. Returns the length.
    pub fn encode_with_copy(&self, stack: &[u64], regs: &UserRegs, copy: &[u8], out: &mut [u8]) -> Option<usize> {
        let len = pause_raw_bytes(0, Some(copy.len()));
        let out = out.get_mut(..len)?;
        let n = self.encode(stack, out)?;
        out[n..PAUSE_RECORD_SIZE].fill(0);
        out[4..8].copy_from_slice(&(self.flags | PAUSE_USTACK).to_ne_bytes());
        let r = UserRegs { magic: USTACK_MAGIC, copied: copy.len() as u32, ..*regs };
        let mut o = PAUSE_RECORD_SIZE;
        for v in [r.magic, r.flags] {
            out[o..o + 4].copy_from_slice(&v.to_ne_bytes());
            o += 4;
        }
        for v in [r.pc, r.sp, r.fp, r.lr] {
            out[o..o + 8].copy_from_slice(&v.to_ne_bytes());
            o += 8;
        }
        for v in [r.copied, r.size] {
            out[o..o + 4].copy_from_slice(&v.to_ne_bytes());
            o += 4;
        }
        out[o..].copy_from_slice(copy);
        Some(len)
    }
}

/// `PERF_CONTEXT_MAX` as a u64: callchain entries at or above it are context markers
/// (`PERF_CONTEXT_USER` = -512, ...), not addresses.
pub const PERF_CONTEXT_MAX: u64 = -4095i64 as u64;

/// The addresses of a user stack as `bpf_get_stack(.., BPF_F_USER_STACK)` wrote them: leading
/// context markers are dropped. When the sampled event has `PERF_SAMPLE_CALLCHAIN`,
/// `bpf_get_stack_pe()` (kernel/bpf/stackmap.c) copies the kernel's callchain instead of
/// walking, and that copy starts with `PERF_CONTEXT_USER`.
pub fn user_frames(stack: &[u64]) -> &[u64] {
    let skip = stack.iter().take_while(|&&a| a >= PERF_CONTEXT_MAX).count();
    &stack[skip..]
}

/// Counter: windows the pause program closed (records written or attempted).
pub const COUNTER_WINDOWS: u32 = 6;
/// Counter: pauses that closed no window (the trace was already paused).
pub const COUNTER_PAUSE_IDLE: u32 = 7;
/// Counter: windows closed in another process (header-only records).
pub const COUNTER_FOREIGN_WINDOWS: u32 = 8;
/// Counter: `bpf_perf_event_output` failed (record lost).
pub const COUNTER_OUTPUT_ERR: u32 = 9;
/// Counter: resumes that opened a window.
pub const COUNTER_RESUMES: u32 = 10;

/// One branch record as the kernel's `struct perf_branch_entry` lays it out (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BranchEntry {
    /// Branch source address.
    pub from: u64,
    /// Branch target address.
    pub to: u64,
    /// Packed flags (mispred, predicted, in_tx, abort, cycles, type, ...).
    pub flags: u64,
}

/// Record flag: the `branches` array is valid for `branch_count` entries.
pub const REC_HAS_BRANCHES: u32 = 1;

/// One sample of a target thread, written by the eBPF program into the ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SampleRecord {
    /// Thread-group id (the process id).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// CPU the sample was taken on.
    pub cpu: u32,
    /// `REC_*` flags.
    pub flags: u32,
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds (see the crate docs).
    pub time_ns: u64,
    /// Number of valid entries in `stack`.
    pub stack_len: u32,
    /// Number of valid entries in `branches`.
    pub branch_count: u32,
    /// User stack, leaf first: `[0]` is the sampled IP, then return addresses.
    pub stack: [u64; MAX_STACK_DEPTH],
    /// Branch records, newest first (only if `flags & REC_HAS_BRANCHES`).
    pub branches: [BranchEntry; MAX_BRANCHES],
}

/// Size of a [`SampleRecord`] in bytes.
pub const SAMPLE_RECORD_SIZE: usize = core::mem::size_of::<SampleRecord>();

impl SampleRecord {
    /// Reads a record from ring-buffer bytes; `None` if `bytes` is too short.
    pub fn from_bytes(bytes: &[u8]) -> Option<SampleRecord> {
        if bytes.len() < SAMPLE_RECORD_SIZE {
            return None;
        }
        // SAFETY: SampleRecord is repr(C) plain data (integers only), valid for any bit
        // pattern, and the length was checked; read_unaligned copes with any alignment.
        Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast::<SampleRecord>()) })
    }

    /// The valid part of the stack (leaf first), clamped to the array size, without the
    /// context markers a callchain copy starts with ([`user_frames`]).
    pub fn stack(&self) -> &[u64] {
        let n = (self.stack_len as usize).min(MAX_STACK_DEPTH);
        user_frames(&self.stack[..n])
    }

    /// The valid branch records (newest first), clamped to the array size.
    pub fn branches(&self) -> &[BranchEntry] {
        if self.flags & REC_HAS_BRANCHES == 0 {
            return &[];
        }
        let n = (self.branch_count as usize).min(MAX_BRANCHES);
        &self.branches[..n]
    }
}

/// [`UserRegs::magic`].
pub const USTACK_MAGIC: u32 = 0x5553_544b; // "KTSU"
/// [`UserRegs::flags`]: the registers are the user's (the sample interrupted user mode).
pub const USTACK_REGS: u32 = 1;
/// [`UserRegs::flags`]: the stack copy failed (`copied` is 0).
pub const USTACK_COPY_ERR: u32 = 2;
/// [`UserRegs::flags`]: the sample was taken in the kernel; the registers are the task's
/// user registers saved at its entry into the kernel (`bpf_task_pt_regs`).
pub const USTACK_TASK_REGS: u32 = 4;

/// The user registers an unwinder starts from, written after the [`SampleRecord`] part of a
/// [`StackRecord`]. x86-64: `pc` = ip, `fp` = bp, `lr` unused; AArch64: `fp` = x29, `lr` = x30.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserRegs {
    /// [`USTACK_MAGIC`].
    pub magic: u32,
    /// `USTACK_*` flags.
    pub flags: u32,
    pub pc: u64,
    pub sp: u64,
    pub fp: u64,
    pub lr: u64,
    /// Bytes of the stack copied (from `sp` up), at most `size`.
    pub copied: u32,
    /// Size of the record's stack area (its size class).
    pub size: u32,
}

/// Size of [`UserRegs`].
pub const USER_REGS_SIZE: usize = core::mem::size_of::<UserRegs>();

/// A sample with the user registers and a copy of the top `N` bytes of the user stack (`N` one
/// of [`STACK_SIZES`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StackRecord<const N: usize> {
    pub sample: SampleRecord,
    pub regs: UserRegs,
    pub bytes: [u8; N],
}

impl UserRegs {
    /// The registers and the copied stack bytes of a ring record, if it is a [`StackRecord`]
    /// (longer than a [`SampleRecord`], with the magic); the copy is clamped to the bytes
    /// present, so a corrupt length never reads past the record.
    pub fn parse(record: &[u8]) -> Option<(UserRegs, &[u8])> {
        UserRegs::parse_at(record, SAMPLE_RECORD_SIZE)
    }

    /// [`UserRegs::parse`] of registers at byte `offset` of `record` (the copy after them).
    pub fn parse_at(record: &[u8], offset: usize) -> Option<(UserRegs, &[u8])> {
        let tail = record.get(offset..)?;
        let head = tail.get(..USER_REGS_SIZE)?;
        let u32_at = |o: usize| u32::from_ne_bytes([head[o], head[o + 1], head[o + 2], head[o + 3]]);
        let u64_at = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&head[o..o + 8]);
            u64::from_ne_bytes(b)
        };
        if u32_at(0) != USTACK_MAGIC {
            return None;
        }
        let regs = UserRegs {
            magic: USTACK_MAGIC,
            flags: u32_at(4),
            pc: u64_at(8),
            sp: u64_at(16),
            fp: u64_at(24),
            lr: u64_at(32),
            copied: u32_at(40),
            size: u32_at(44),
        };
        let data = &tail[USER_REGS_SIZE..];
        let n = (regs.copied as usize).min(regs.size as usize).min(data.len());
        Some((regs, &data[..n]))
    }
}

#[cfg(feature = "user")]
// SAFETY: plain-data repr(C) structs without padding-sensitive invariants.
unsafe impl aya::Pod for SampleRecord {}
#[cfg(feature = "user")]
// SAFETY: plain-data repr(C) struct.
unsafe impl aya::Pod for BranchEntry {}
#[cfg(feature = "user")]
// SAFETY: plain-data repr(C) struct without padding.
unsafe impl aya::Pod for WindowState {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout must match what the eBPF side writes (no hidden padding, 8-byte aligned tails).
    #[test]
    fn layout_is_stable() {
        assert_eq!(core::mem::size_of::<BranchEntry>(), 24);
        assert_eq!(core::mem::offset_of!(SampleRecord, stack), 32);
        assert_eq!(core::mem::offset_of!(SampleRecord, branches), 32 + 8 * MAX_STACK_DEPTH);
        assert_eq!(SAMPLE_RECORD_SIZE, 32 + 8 * MAX_STACK_DEPTH + 24 * MAX_BRANCHES);
        assert_eq!(core::mem::offset_of!(PauseRecord, stack), PAUSE_HEADER);
        assert_eq!(core::mem::offset_of!(PauseRecord, window_ns), 16);
        assert_eq!(core::mem::size_of::<WindowState>(), 16);
    }

    use core::mem::offset_of;

    /// A stack record's registers and copy read back; too-short, foreign or lying records
    /// are refused or clamped.
    #[test]
    fn user_stack_round_trip_and_clamps() {
        assert_eq!(USER_REGS_SIZE, 48);
        assert_eq!(offset_of!(StackRecord<4096>, regs), SAMPLE_RECORD_SIZE);
        assert_eq!(offset_of!(StackRecord<4096>, bytes), SAMPLE_RECORD_SIZE + USER_REGS_SIZE);
        assert_eq!(core::mem::size_of::<StackRecord<4096>>() % 8, 0);
        let mut raw = [0u8; SAMPLE_RECORD_SIZE + USER_REGS_SIZE + 64];
        let regs = UserRegs { magic: USTACK_MAGIC, flags: USTACK_REGS, pc: 1, sp: 2, fp: 3, lr: 4, copied: 16, size: 64 };
        // SAFETY: UserRegs is repr(C) plain data; the slice has room for it.
        unsafe { core::ptr::write_unaligned(raw[SAMPLE_RECORD_SIZE..].as_mut_ptr().cast::<UserRegs>(), regs) };
        raw[SAMPLE_RECORD_SIZE + USER_REGS_SIZE] = 0xaa;
        let (r, st) = UserRegs::parse(&raw).unwrap();
        assert_eq!(r, regs);
        assert_eq!(st.len(), 16);
        assert_eq!(st[0], 0xaa);
        // A plain sample record has no copy.
        assert!(UserRegs::parse(&raw[..SAMPLE_RECORD_SIZE]).is_none());
        assert!(UserRegs::parse(&raw[..SAMPLE_RECORD_SIZE + 10]).is_none());
        // A length past the record is clamped to what is there.
        raw[SAMPLE_RECORD_SIZE + 40..SAMPLE_RECORD_SIZE + 44].copy_from_slice(&9999u32.to_ne_bytes());
        raw[SAMPLE_RECORD_SIZE + 44..SAMPLE_RECORD_SIZE + 48].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert_eq!(UserRegs::parse(&raw).unwrap().1.len(), 64);
        raw[SAMPLE_RECORD_SIZE] ^= 1;
        assert!(UserRegs::parse(&raw).is_none());
    }

    /// The full/contended split follows `bpf_ringbuf_has_space`: a record of 1816 bytes takes
    /// 1824 with its header, and fits while producer - consumer + 1824 <= size - 1.
    #[test]
    fn reservation_failures_split_as_the_kernel_tests_space() {
        let size = 4096u64;
        assert!(!reserve_failed_full(0, size, 1816));
        assert!(!reserve_failed_full(size - 1 - 1824, size, 1816));
        assert!(reserve_failed_full(size - 1824, size, 1816));
        assert!(reserve_failed_full(u64::MAX, size, 1816));
        assert_eq!((1816 + RINGBUF_HDR_SZ + 7) & !7, 1824);
    }

    /// A pause record's header and stack read back from the bytes the program writes, with
    /// the kernel's raw padding after them; other payloads and short stacks are refused.
    #[test]
    fn pause_header_round_trip() {
        let mut raw = [0u8; PAUSE_HEADER + 8 * 3 + 4];
        let want = PauseHeader { flags: PAUSE_TARGET, pid: 42, tid: 43, window_ns: 1234, seq: 7, stack_len: 3 };
        assert_eq!(want.encode(&[0x1000, 0x1001, 0x1002], &mut raw), Some(PAUSE_HEADER + 24));
        // The program's field offsets (the struct the kernel side writes).
        assert_eq!(raw[0..4], PAUSE_MAGIC.to_ne_bytes());
        assert_eq!(raw[16..24], 1234u64.to_ne_bytes());
        assert_eq!(raw[offset_of!(PauseRecord, stack)..][..8], 0x1000u64.to_ne_bytes());
        let (h, st) = PauseHeader::parse(&raw).unwrap();
        assert_eq!(h, want);
        assert_eq!(st.len(), 24);
        assert!(PauseHeader::user_stack(&raw).is_none(), "no copy without PAUSE_USTACK");
        raw[28] = 9;
        assert!(PauseHeader::parse(&raw).is_none(), "9 frames do not fit");
        raw[0] ^= 1;
        assert!(PauseHeader::parse(&raw).is_none());
    }

    /// A pause record with a stack copy: the header and frames read as before (older readers
    /// keep working), the registers and copy after the whole PauseRecord, at the offsets of
    /// `PauseStackRecord`; a copy length past the payload is clamped.
    #[test]
    fn pause_stack_record_round_trip() {
        assert_eq!(offset_of!(PauseStackRecord<4096>, regs), PAUSE_RECORD_SIZE);
        assert_eq!(offset_of!(PauseStackRecord<4096>, bytes), PAUSE_RECORD_SIZE + USER_REGS_SIZE);
        assert_eq!(PAUSE_RECORD_SIZE % 8, 0);
        let h = PauseHeader { flags: PAUSE_TARGET, pid: 42, tid: 43, window_ns: 9, seq: 1, stack_len: 2 };
        let regs = UserRegs { flags: USTACK_REGS, pc: 0x1000, sp: 0x7f00, fp: 3, lr: 4, size: 4096, ..Default::default() };
        let copy = [0x5au8; 100];
        let mut raw = [0u8; PAUSE_RECORD_SIZE + USER_REGS_SIZE + 100 + 4];
        let n = h.encode_with_copy(&[0x1000, 0x2000], &regs, &copy, &mut raw).unwrap();
        assert_eq!(n, pause_raw_bytes(2, Some(100)));
        let (h2, st) = PauseHeader::parse(&raw).unwrap();
        assert_eq!((h2.flags, h2.stack_len, st.len()), (PAUSE_TARGET | PAUSE_USTACK, 2, 16));
        let (r, c) = PauseHeader::user_stack(&raw).unwrap();
        assert_eq!((r.pc, r.sp, r.fp, r.lr, r.copied, r.size), (0x1000, 0x7f00, 3, 4, 100, 4096));
        assert_eq!(c, &copy[..]);
        assert_eq!(PauseHeader::user_stack(&raw[..PAUSE_RECORD_SIZE + USER_REGS_SIZE + 10]).unwrap().1.len(), 10);
        assert!(PauseHeader::user_stack(&raw[..PAUSE_RECORD_SIZE + 8]).is_none());
    }

    /// Context markers (PERF_CONTEXT_USER and the others above PERF_CONTEXT_MAX) at the start
    /// of a copied callchain are not frames.
    #[test]
    fn markers_are_not_frames() {
        let user = -512i64 as u64;
        assert_eq!(user_frames(&[user, 0x400100, 0x400200]), &[0x400100, 0x400200]);
        assert_eq!(user_frames(&[0x400100]), &[0x400100]);
        assert_eq!(user_frames(&[user]), &[] as &[u64]);
    }

    /// Reading back clamps lengths that a corrupt record could carry.
    #[test]
    fn from_bytes_clamps_lengths() {
        let mut bytes = [0u8; SAMPLE_RECORD_SIZE];
        let mut put = |off: usize, v: u32| bytes[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        put(core::mem::offset_of!(SampleRecord, stack_len), 9999);
        put(core::mem::offset_of!(SampleRecord, flags), REC_HAS_BRANCHES);
        put(core::mem::offset_of!(SampleRecord, branch_count), 77);
        let r = SampleRecord::from_bytes(&bytes).unwrap();
        assert_eq!(r.stack().len(), MAX_STACK_DEPTH);
        assert_eq!(r.branches().len(), MAX_BRANCHES);
        assert!(SampleRecord::from_bytes(&bytes[1..]).is_none());
    }
}
