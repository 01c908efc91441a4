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
/// Maximum number of branch records (LBR/BRBE via `bpf_read_branch_records`) per sample.
pub const MAX_BRANCHES: usize = 32;

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

/// Counter: samples of the target that were written to the ring buffer.
pub const COUNTER_SAMPLES: u32 = 0;
/// Counter: samples dropped because the ring buffer was full.
pub const COUNTER_RING_FULL: u32 = 1;
/// Counter: samples dropped because `bpf_get_stack` failed (or returned no frame).
pub const COUNTER_STACK_ERR: u32 = 2;
/// Counter: `bpf_read_branch_records` failed (sample kept, without branches).
pub const COUNTER_BRANCH_ERR: u32 = 3;
/// Counter: `bpf_read_branch_records` returned -ENOENT (no branch stack on this event/CPU).
pub const COUNTER_BRANCH_ENOENT: u32 = 4;
/// Counter: samples of other processes that the tgid filter skipped.
pub const COUNTER_FILTERED: u32 = 5;
/// Number of counters in the counter map.
pub const COUNTER_ENTRIES: u32 = 8;

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

    /// The valid part of the stack (leaf first), clamped to the array size.
    pub fn stack(&self) -> &[u64] {
        let n = (self.stack_len as usize).min(MAX_STACK_DEPTH);
        &self.stack[..n]
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

#[cfg(feature = "user")]
// SAFETY: plain-data repr(C) structs without padding-sensitive invariants.
unsafe impl aya::Pod for SampleRecord {}
#[cfg(feature = "user")]
// SAFETY: plain-data repr(C) struct.
unsafe impl aya::Pod for BranchEntry {}

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
