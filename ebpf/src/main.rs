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
    use core::{ffi::c_void, mem::offset_of, ptr::addr_of_mut};

    use aya_ebpf::{
        EbpfContext,
        bindings::{BPF_F_USER_STACK, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
        helpers::{
            bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns,
            generated::{bpf_get_stack, bpf_read_branch_records},
        },
        macros::{map, perf_event},
        maps::{Array, PerCpuArray, RingBuf},
        programs::PerfEventContext,
    };
    use etm_bpf_common::{
        BranchEntry, CONFIG_ENTRIES, CONFIG_FLAGS, CONFIG_TGID, COUNTER_BRANCH_ENOENT, COUNTER_BRANCH_ERR, COUNTER_ENTRIES,
        COUNTER_FILTERED, COUNTER_RING_FULL, COUNTER_SAMPLES, COUNTER_STACK_ERR, FLAG_READ_BRANCHES, MAX_BRANCHES,
        MAX_STACK_DEPTH, REC_HAS_BRANCHES, RING_BYTES, RING_WAKEUP_BYTES, SampleRecord,
    };

    #[map]
    static SAMPLES: RingBuf = RingBuf::with_byte_size(RING_BYTES, 0);

    #[map]
    static CONFIG: Array<u32> = Array::with_max_entries(CONFIG_ENTRIES, 0);

    #[map]
    static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_ENTRIES, 0);

    const ENOENT: i64 = 2;

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
        let want = config(CONFIG_TGID);
        if tgid == 0 || (want != 0 && tgid != want) {
            count(COUNTER_FILTERED);
            return Err(());
        }
        let flags = config(CONFIG_FLAGS);

        let Some(mut entry) = SAMPLES.reserve::<SampleRecord>(0) else {
            count(COUNTER_RING_FULL);
            return Err(());
        };
        let rec = entry.as_mut_ptr();
        // SAFETY: `rec` points to a reserved ring-buffer entry of size_of::<SampleRecord>() bytes;
        // every write below stays inside it (offsets and sizes are compile-time constants).
        unsafe {
            let stack_ptr = (rec as *mut u8).add(offset_of!(SampleRecord, stack)) as *mut c_void;
            let n = bpf_get_stack(ctx.as_ptr(), stack_ptr, (MAX_STACK_DEPTH * 8) as u32, BPF_F_USER_STACK as u64);
            if n <= 0 {
                entry.discard(0);
                count(COUNTER_STACK_ERR);
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
                } else if r == -ENOENT {
                    count(COUNTER_BRANCH_ENOENT);
                } else {
                    count(COUNTER_BRANCH_ERR);
                }
            }
            addr_of_mut!((*rec).flags).write(rec_flags);
            addr_of_mut!((*rec).branch_count).write(nbranch);
        }
        // Wake user space only once enough is pending (it also drains on a timer).
        let wake =
            if SAMPLES.query(BPF_RB_AVAIL_DATA as u64) >= RING_WAKEUP_BYTES { BPF_RB_FORCE_WAKEUP } else { BPF_RB_NO_WAKEUP };
        entry.submit(wake as u64);
        count(COUNTER_SAMPLES);
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
