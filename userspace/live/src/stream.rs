//! Draining one perf mmap (data ring + AUX ring) into pipeline events. Pure logic over a
//! [`RingSource`], so the whole loop runs in tests against fake rings built from bytes.

use std::collections::HashMap;

use etm_perf::records::{CsHwId, Mmap2FileId, PerfRecord, SampleFormat, parse_record};
use etm_perf::ring::{AuxCursor, AuxStats, DataRingStats, read_data_ring};

use crate::ring::RingSource;
use etm_session::session::{AuxRecord, PauseSample, SessionEvent, Sideband, UserStack};

/// Where drained events go (the pipeline, a session writer, or both).
pub trait EventSink {
    fn event(&mut self, ev: SessionEvent<'_>);
}

impl<F: FnMut(SessionEvent<'_>)> EventSink for F {
    fn event(&mut self, ev: SessionEvent<'_>) {
        self(ev)
    }
}

/// What an event id in the ring is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdRole {
    /// cs_etm leader (no samples expected).
    Etm,
    /// Resume event: its samples mark window starts (counted, not forwarded).
    Resume,
    /// Pause event (its samples, if any, are counted: the pause program suppresses them).
    Pause,
    /// The bpf-output event: its samples carry the pause program's records
    /// (`etm_bpf_common::PauseRecord` as PERF_SAMPLE_RAW), stamped by the kernel.
    BpfOutput,
}

/// Counters of one stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StreamStats {
    pub data: DataRingStats,
    pub aux: AuxStats,
    /// Records that failed to parse (truncated, bad size, unsupported sample_type).
    pub bad_records: u64,
    /// Resume samples seen.
    pub resume_samples: u64,
    /// Samples from ids not in the group.
    pub unknown_samples: u64,
    /// Records of types the pipeline does not use.
    pub other_records: u64,
    /// Sum of PERF_RECORD_LOST counts.
    pub lost: u64,
    /// Re-enable ioctls that failed.
    pub reenable_errors: u64,
    /// Samples and sideband of other processes dropped by the target filter.
    pub filtered: u64,
    /// Pause records of the target (windows closed in it).
    pub pause_records: u64,
    /// Header-only pause records: windows closed in another process.
    pub foreign_windows: u64,
    /// Pause records of the target without a frame-pointer stack (`bpf_get_stack` failed).
    pub stack_errors: u64,
    /// Of those, the ones that still made a sample: they carried the user registers and a
    /// stack copy (the stack is the copy's pc, then its unwind). The others only end the
    /// window.
    pub stacks_from_copy: u64,
    /// bpf-output samples that are not pause records.
    pub bad_pause_records: u64,
    /// Windows missing from the pause records' sequence numbers (records lost).
    pub window_seq_gaps: u64,
    /// Samples of the pause or resume events themselves (0 while the programs are attached).
    pub kernel_samples: u64,
    /// PERF_RECORD_THROTTLE records (the kernel stopped the group).
    pub throttles: u64,
    /// PERF_RECORD_UNTHROTTLE records.
    pub unthrottles: u64,
    /// Context-switch records.
    pub switches: u64,
    /// Pause records whose stack began with a callchain context marker (the pause event had
    /// PERF_SAMPLE_CALLCHAIN, so `bpf_get_stack` copied the kernel's callchain); stripped.
    pub stack_markers: u64,
    /// Pause records whose first frame is not the sample's IP (the interrupted user PC, as
    /// the kernel stamped it): a stack that does not start where the pause hit.
    pub leaf_not_ip: u64,
    /// Pause records of the target carrying the user registers and a stack copy.
    pub stack_copies: u64,
}

/// The bpf-output sample the pause program makes the kernel write for one closed window:
/// PERF_RECORD_SAMPLE of the bpf-output event (`fmt`, trailer `sid` with the event's id), its
/// IP the interrupted PC, the [`etm_bpf_common::PauseRecord`] bytes of `h` and `stack` as
/// PERF_SAMPLE_RAW. The producer side of tests and of the driver model.
pub fn pause_sample_record(
    fmt: &SampleFormat,
    sid: &etm_perf::records::SampleId,
    h: &etm_bpf_common::PauseHeader,
    stack: &[u64],
) -> Vec<u8> {
    let mut raw = vec![0u8; etm_bpf_common::PAUSE_RECORD_SIZE];
    let n = h.encode(stack, &mut raw).expect("a full record fits");
    let ip = etm_bpf_common::user_frames(&stack[..(h.stack_len as usize).min(stack.len())]).first().copied().unwrap_or(0);
    etm_perf::records::build::sample_raw(fmt, sid, ip, 1, &[], &raw[..n])
}

/// Consumer state of one mmap (one CPU, or one thread with cpu = -1).
pub struct CpuStream {
    /// CPU of the AUX buffer (-1 per-thread).
    pub cpu: i32,
    pub fmt: SampleFormat,
    /// Sample formats by event id (pause events carry CALLCHAIN, others not).
    formats: HashMap<u64, (IdRole, SampleFormat)>,
    cursor: AuxCursor,
    scratch: Vec<u8>,
    aux_bytes: Vec<u8>,
    stack: Vec<u64>,
    /// The last stack copy's buffer, reused.
    copy: Vec<u8>,
    pub stats: StreamStats,
    /// Trace IDs seen in AUX_OUTPUT_HW_ID records (trace id -> sink id).
    pub hw_ids: Vec<CsHwId>,
    /// Keep only this process's pause samples and MMAP2/COMM/FORK/EXIT records (system-wide
    /// per-CPU tracing of one target). AUX data and the other records are always forwarded.
    pub target: Option<u32>,
    /// Sequence number of the last pause record per window slot (CPU).
    last_seq: HashMap<i32, u32>,
    /// Newest perf-clock time of any record drained (0: none yet).
    pub newest_time: u64,
    /// Newest perf-clock time of a PERF_RECORD_AUX drained (0: none yet).
    pub newest_aux_time: u64,
}

impl CpuStream {
    /// `fmt` is the trailer layout shared by all events of the ring; `ids` maps event ids
    /// (PERF_EVENT_IOC_ID) to their role and own sample format.
    pub fn new(cpu: i32, fmt: SampleFormat, ids: &[(u64, IdRole, SampleFormat)], aux_size: u64) -> Self {
        CpuStream {
            cpu,
            fmt,
            formats: ids.iter().map(|&(id, r, f)| (id, (r, f))).collect(),
            cursor: AuxCursor::new(aux_size, 0),
            scratch: Vec::new(),
            aux_bytes: Vec::new(),
            stack: Vec::new(),
            copy: Vec::new(),
            stats: StreamStats::default(),
            hw_ids: Vec::new(),
            target: None,
            last_seq: HashMap::new(),
            newest_time: 0,
            newest_aux_time: 0,
        }
    }

    /// Whether the buffer has an AUX area (a cs_etm group, not a stand-in or output ring).
    pub fn has_aux(&self) -> bool {
        self.cursor.size() > 0
    }

    /// Drains everything pending: parses `[data_tail, data_head)`, copies each AUX window out
    /// of the AUX ring, hands events to `sink`, then publishes `data_tail` and `aux_tail` and
    /// re-enables the AUX event if the kernel disabled it (full buffer or TRUNCATED).
    pub fn drain(&mut self, src: &mut impl RingSource, sink: &mut impl EventSink) -> usize {
        let (head, tail, aux_head, aux_tail) = {
            let pg = src.page();
            (pg.data_head(), pg.data_tail(), pg.aux_head(), pg.aux_tail())
        };
        if !src.aux().is_empty() {
            self.cursor.observe_head(aux_head, aux_tail);
        }
        let mut n = 0;
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut data_stats = self.stats.data;
        let new_tail = read_data_ring(src.data(), tail, head, &mut scratch, &mut data_stats, |bytes| {
            n += 1;
            self.record(bytes, src.aux(), sink);
        });
        self.stats.data = data_stats;
        self.scratch = scratch;
        let pg = src.page();
        pg.set_data_tail(new_tail);
        if !src.aux().is_empty() {
            // Still full after every record was processed: the records describing the data
            // were lost (data ring overflow), so nothing would ever free the ring. Skip to the
            // head (counted as a gap) so the kernel can write again.
            let size = src.aux().len() as u64;
            if aux_head.saturating_sub(self.cursor.tail()) >= size {
                self.cursor.skip_to(aux_head);
            }
            // Everything up to the cursor has been copied (or skipped as a gap); the kernel
            // may reuse it. Never move the tail backwards or past the head.
            let t = self.cursor.tail().min(aux_head.max(pg.aux_head())).max(aux_tail);
            pg.set_aux_tail(t);
        }
        self.stats.aux = self.cursor.stats;
        if self.cursor.take_reenable() {
            if let Err(e) = src.reenable() {
                log::warn!("cpu {}: re-enabling cs_etm failed: {e}", self.cpu);
                self.stats.reenable_errors += 1;
            }
            self.stats.aux = self.cursor.stats;
        }
        n
    }

    /// A bpf-output sample: the pause program's record of one closed window, in the perf
    /// clock of the sample's trailer.
    fn pause_record(&mut self, s: &etm_perf::records::Sample<'_>, sink: &mut impl EventSink) {
        let Some((h, stack)) = etm_bpf_common::PauseHeader::parse(s.raw) else {
            self.stats.bad_pause_records += 1;
            return;
        };
        let cpu = s.cpu.map_or(self.cpu, |c| c as i32);
        let slot = if self.cpu < 0 { -1 } else { cpu };
        if let Some(prev) = self.last_seq.insert(slot, h.seq) {
            self.stats.window_seq_gaps += u64::from(h.seq.wrapping_sub(prev).saturating_sub(1));
        }
        let time = s.time.unwrap_or(0);
        let window_ns = Some(h.window_ns);
        if h.flags & etm_bpf_common::PAUSE_TARGET == 0 || self.target.is_some_and(|t| t != h.pid) {
            self.stats.foreign_windows += 1;
            let sb = Sideband::WindowEnd { pid: h.pid, tid: h.tid, window_ns, time, cpu };
            sink.event(SessionEvent::Sideband(&sb));
            return;
        }
        self.stats.pause_records += 1;
        self.stack.clear();
        self.stack.extend(stack.chunks_exact(8).map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes"))));
        let n = etm_bpf_common::user_frames(&self.stack).len();
        if n < self.stack.len() {
            self.stats.stack_markers += 1;
            self.stack.drain(..self.stack.len() - n);
        }
        if let (Some(ip), Some(&leaf)) = (s.ip, self.stack.first())
            && ip != leaf
        {
            self.stats.leaf_not_ip += 1;
        }
        // The registers and stack copy (`--unwind dwarf|auto`), in a buffer reused across
        // records.
        let copy = etm_bpf_common::PauseHeader::user_stack(s.raw);
        if self.stack.is_empty() {
            // `bpf_get_stack` failed (e.g. the CPU's callchain buffer was in use by a nested
            // perf event: get_perf_callchain() gives none). With the user registers and a
            // stack copy the window still has its stack: the copy's pc, unwound from the copy
            // downstream as every copy is.
            self.stats.stack_errors += 1;
            match copy {
                Some((r, c)) if r.flags & etm_bpf_common::USTACK_REGS != 0 && !c.is_empty() => {
                    self.stats.stacks_from_copy += 1;
                    self.stack.push(r.pc);
                }
                _ => {
                    // A window of the target without a stack: it still ends the CPU's window.
                    let sb = Sideband::WindowEnd { pid: h.pid, tid: h.tid, window_ns, time, cpu };
                    sink.event(SessionEvent::Sideband(&sb));
                    return;
                }
            }
        }
        let user_stack = copy.map(|(r, copy)| {
            self.stats.stack_copies += 1;
            let mut bytes = std::mem::take(&mut self.copy);
            bytes.clear();
            bytes.extend_from_slice(copy);
            UserStack { flags: r.flags, pc: r.pc, sp: r.sp, fp: r.fp, lr: r.lr, size: r.size, bytes }
        });
        let p = PauseSample {
            cpu,
            pid: h.pid,
            tid: h.tid,
            time,
            stack: std::mem::take(&mut self.stack),
            branches: None,
            branch_flags: Vec::new(),
            window_ns,
            user_stack,
        };
        sink.event(SessionEvent::Sample(&p));
        self.stack = p.stack;
        if let Some(u) = p.user_stack {
            self.copy = u.bytes;
        }
    }

    fn record(&mut self, bytes: &[u8], aux: &[u8], sink: &mut impl EventSink) {
        // SAMPLE layouts differ per event: the first u64 of the body is PERF_SAMPLE_IDENTIFIER.
        let mut fmt = self.fmt;
        let mut role = None;
        if etm_perf::records::peek_header(bytes).is_some_and(|h| h.0 == etm_perf::records::types::SAMPLE)
            && let Some(id) = bytes.get(8..16).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
        {
            match self.formats.get(&id) {
                Some(&(r, f)) => {
                    fmt = f;
                    role = Some(r);
                }
                None => {
                    self.stats.unknown_samples += 1;
                    return;
                }
            }
        }
        let rec = match parse_record(bytes, &fmt) {
            Ok(r) => r,
            Err(e) => {
                log::debug!("cpu {}: bad perf record: {e}", self.cpu);
                self.stats.bad_records += 1;
                return;
            }
        };
        let id = rec.sample_id;
        let time = id.time.unwrap_or(0);
        let cpu = id.cpu.map(|c| c as i32);
        let rec_time = match &rec.kind {
            PerfRecord::Sample(s) => s.time.unwrap_or(0),
            _ => time,
        };
        self.newest_time = self.newest_time.max(rec_time);
        let sb = match rec.kind {
            PerfRecord::Aux { aux_offset, aux_size, flags } => {
                self.newest_aux_time = self.newest_aux_time.max(time);
                let w = self.cursor.on_aux_record_in(aux, aux_offset, aux_size, flags);
                self.aux_bytes.clear();
                if !self.cursor.copy_window(aux, &w, &mut self.aux_bytes) {
                    self.stats.bad_records += 1;
                }
                let record = AuxRecord {
                    cpu: self.cpu,
                    flags,
                    time,
                    aux_offset: w.start,
                    size: w.len,
                    source_cpu: cpu.filter(|&c| c != self.cpu),
                };
                sink.event(SessionEvent::Aux { record, data: &self.aux_bytes });
                return;
            }
            PerfRecord::Sample(s) => {
                match role {
                    Some(IdRole::BpfOutput) => self.pause_record(&s, sink),
                    Some(IdRole::Resume) => self.stats.resume_samples += 1,
                    Some(IdRole::Pause) => self.stats.kernel_samples += 1,
                    _ => self.stats.unknown_samples += 1,
                }
                return;
            }
            PerfRecord::Throttle { id: eid, unthrottle, time: t, .. } => {
                if unthrottle {
                    self.stats.unthrottles += 1;
                } else {
                    self.stats.throttles += 1;
                }
                Sideband::Throttle { id: eid, unthrottle, time: t, cpu: cpu.or((self.cpu >= 0).then_some(self.cpu)) }
            }
            PerfRecord::Switch { out, next_prev } => {
                self.stats.switches += 1;
                Sideband::Switch {
                    out,
                    pid: id.pid.unwrap_or(0),
                    tid: id.tid.unwrap_or(0),
                    next_prev,
                    time,
                    cpu: cpu.or((self.cpu >= 0).then_some(self.cpu)),
                }
            }
            PerfRecord::Mmap2(m) => Sideband::Mmap2 {
                pid: m.pid,
                tid: m.tid,
                addr: m.addr,
                len: m.len,
                pgoff: m.pgoff,
                prot: m.prot,
                flags: m.flags,
                filename: String::from_utf8_lossy(m.filename).into_owned(),
                build_id: match m.file_id {
                    Mmap2FileId::BuildId(b) => Some(b.iter().map(|x| format!("{x:02x}")).collect()),
                    Mmap2FileId::Inode { .. } => None,
                },
                time,
                cpu,
            },
            PerfRecord::Comm { pid, tid, comm, exec } => {
                Sideband::Comm { pid, tid, comm: String::from_utf8_lossy(comm).into_owned(), exec, time, cpu }
            }
            PerfRecord::Fork { pid, ppid, tid, ptid, time: t } => Sideband::Fork { pid, ppid, tid, ptid, time: t, cpu },
            PerfRecord::Exit { pid, ppid, tid, ptid, time: t } => Sideband::Exit { pid, ppid, tid, ptid, time: t, cpu },
            PerfRecord::Lost { id: eid, lost } => {
                self.stats.lost += lost;
                Sideband::Lost { id: eid, lost, time, cpu }
            }
            PerfRecord::ItraceStart { pid, tid } => Sideband::ItraceStart { pid, tid, time, cpu },
            PerfRecord::AuxOutputHwId { hw_id } => {
                self.hw_ids.push(CsHwId::decode(hw_id));
                Sideband::AuxOutputHwId { hw_id, time, cpu }
            }
            _ => {
                self.stats.other_records += 1;
                return;
            }
        };
        if let Some(t) = self.target {
            let keep = match &sb {
                Sideband::Mmap2 { pid, .. } | Sideband::Comm { pid, .. } => *pid == t,
                Sideband::Fork { pid, ppid, .. } | Sideband::Exit { pid, ppid, .. } => *pid == t || *ppid == t,
                // Switches into or out of the target (CPU-wide records name both tasks).
                Sideband::Switch { pid, next_prev, .. } => *pid == t || next_prev.is_some_and(|(p, _)| p == t),
                _ => true,
            };
            if !keep {
                self.stats.filtered += 1;
                return;
            }
        }
        sink.event(SessionEvent::Sideband(&sb));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::MemRing as FakeRing;
    use etm_perf::attr::RING_SAMPLE_TYPE;
    use etm_perf::records::{SampleId, build, context, sample, types};

    const FMT: SampleFormat =
        SampleFormat { sample_type: RING_SAMPLE_TYPE, sample_id_all: true, branch_hw_index: false, regs_user_mask: 0 };
    const OUT_FMT: SampleFormat = SampleFormat { sample_type: RING_SAMPLE_TYPE | sample::RAW, ..FMT };
    const PAUSE_ID: u64 = 77;
    const OUT_ID: u64 = 79;

    /// The bpf-output sample the pause program produces for a window closed in `pid` (a
    /// target record with `stack`, or header-only if `stack` is empty), with a leading
    /// PERF_CONTEXT_USER as `bpf_get_stack` copies it from a callchain.
    fn pause(id: &SampleId, seq: u32, stack: &[u64]) -> Vec<u8> {
        let mut st = vec![context::USER];
        st.extend_from_slice(stack);
        let flags = if stack.is_empty() { 0 } else { etm_bpf_common::PAUSE_TARGET };
        let h = etm_bpf_common::PauseHeader {
            flags,
            pid: id.pid.unwrap_or(0),
            tid: id.tid.unwrap_or(0),
            window_ns: 700,
            seq,
            stack_len: if stack.is_empty() { 0 } else { st.len() as u32 },
        };
        pause_sample_record(&OUT_FMT, &SampleId { id: Some(OUT_ID), ..*id }, &h, &st)
    }
    const RESUME_ID: u64 = 78;

    fn sid(time: u64) -> SampleId {
        SampleId { pid: Some(100), tid: Some(101), time: Some(time), id: Some(5), stream_id: None, cpu: Some(2) }
    }

    fn stream(aux_size: u64) -> CpuStream {
        CpuStream::new(
            2,
            FMT,
            &[
                (5, IdRole::Etm, FMT),
                (PAUSE_ID, IdRole::Pause, FMT),
                (RESUME_ID, IdRole::Resume, FMT),
                (OUT_ID, IdRole::BpfOutput, OUT_FMT),
            ],
            aux_size,
        )
    }

    #[derive(Debug, PartialEq)]
    enum Ev {
        Aux(AuxRecord, Vec<u8>),
        Sample(PauseSample),
        Side(Sideband),
    }

    fn collect(s: &mut CpuStream, ring: &mut FakeRing) -> Vec<Ev> {
        let mut out = Vec::new();
        s.drain(ring, &mut |ev: SessionEvent<'_>| {
            out.push(match ev {
                SessionEvent::Aux { record, data } => Ev::Aux(record, data.to_vec()),
                SessionEvent::Sample(p) => Ev::Sample(p.clone()),
                SessionEvent::Sideband(sb) => Ev::Side(sb.clone()),
            })
        });
        out
    }

    /// A window's bytes, its AUX record, the pause sample with its user callchain and sideband
    /// come out as pipeline events in ring order; resume samples are counted, not forwarded;
    /// both tails are published.
    #[test]
    fn drains_window_then_pause() {
        let mut ring = FakeRing::new(4096, 1024);
        let mut s = stream(1024);
        let trace: Vec<u8> = (0..200u32).map(|i| i as u8).collect();
        ring.push_record(&build::record(types::ITRACE_START, 0, &[100, 0, 0, 0, 101, 0, 0, 0], &FMT, &sid(1)));
        ring.push_record(&build::record(
            types::AUX_OUTPUT_HW_ID,
            0,
            &((1u64 << 56) | (0x55 << 8) | 0x14).to_le_bytes(),
            &FMT,
            &sid(2),
        ));
        let resume = SampleId { id: Some(RESUME_ID), ..sid(3) };
        ring.push_record(&build::sample(&FMT, &resume, 0x400000, 1000, &[]));
        let off = ring.push_aux(&trace);
        ring.push_record(&build::aux(off, trace.len() as u64, 0x100, &FMT, &sid(10)));
        ring.push_record(&pause(&sid(11), 1, &[0x400100, 0x400abc]));
        let out = collect(&mut s, &mut ring);
        assert_eq!(out.len(), 4, "{out:?}");
        assert!(matches!(&out[0], Ev::Side(Sideband::ItraceStart { pid: 100, tid: 101, time: 1, cpu: Some(2) })));
        assert!(matches!(&out[1], Ev::Side(Sideband::AuxOutputHwId { time: 2, .. })));
        assert_eq!(
            out[2],
            Ev::Aux(AuxRecord { cpu: 2, flags: 0x100, time: 10, aux_offset: 0, size: 200, source_cpu: None }, trace.clone())
        );
        assert_eq!(
            out[3],
            Ev::Sample(PauseSample {
                cpu: 2,
                pid: 100,
                tid: 101,
                time: 11,
                stack: vec![0x400100, 0x400abc],
                branches: None,
                branch_flags: Vec::new(),
                window_ns: Some(700),
                user_stack: None,
            })
        );
        assert_eq!((s.stats.resume_samples, s.stats.pause_records), (1, 1));
        assert_eq!(s.hw_ids[0].trace_id, 0x14);
        assert_eq!(ring.data_tail(), ring.page().data_head());
        assert_eq!(ring.aux_tail(), 200);
        assert_eq!(ring.reenables, 0);
    }

    /// A pause record with the user registers and a stack copy (`--unwind dwarf|auto`): the
    /// sample carries both next to the frame-pointer stack, the copy clamped to the payload
    /// (the kernel pads PERF_SAMPLE_RAW to 8 bytes).
    #[test]
    fn pause_record_with_a_stack_copy() {
        let mut ring = FakeRing::new(1 << 16, 1024);
        let mut s = stream(1024);
        let h = etm_bpf_common::PauseHeader {
            flags: etm_bpf_common::PAUSE_TARGET,
            pid: 100,
            tid: 101,
            window_ns: 5,
            seq: 1,
            stack_len: 1,
        };
        let regs = etm_bpf_common::UserRegs {
            flags: etm_bpf_common::USTACK_REGS,
            pc: 0x400100,
            sp: 0x7ff0_0010,
            fp: 1,
            lr: 2,
            size: 4096,
            ..Default::default()
        };
        let copy: Vec<u8> = (0..333u32).map(|i| i as u8).collect();
        let mut raw = vec![0u8; etm_bpf_common::pause_raw_bytes(0, Some(copy.len()))];
        let n = h.encode_with_copy(&[0x400100], &regs, &copy, &mut raw).unwrap();
        for k in 0..2 {
            let sid = SampleId { id: Some(OUT_ID), ..sid(20 + k) };
            ring.push_record(&build::sample_raw(&OUT_FMT, &sid, 0x400100, 1, &[], &raw[..n]));
        }
        let out = collect(&mut s, &mut ring);
        assert_eq!(out.len(), 2, "{out:?}");
        let Ev::Sample(p) = &out[1] else { panic!("{out:?}") };
        assert_eq!(p.stack, vec![0x400100]);
        let u = p.user_stack.as_ref().expect("the copy");
        assert_eq!((u.flags, u.pc, u.sp, u.fp, u.lr, u.size), (1, 0x400100, 0x7ff0_0010, 1, 2, 4096));
        assert_eq!(u.bytes, copy);
        assert_eq!((s.stats.pause_records, s.stats.stack_copies, s.stats.bad_pause_records), (2, 2, 0));
    }

    /// A pause record of the target whose `bpf_get_stack` failed (no frame-pointer stack,
    /// `PAUSE_STACK_ERR`) but that carries the user registers and a copy still makes a sample:
    /// its stack the copy's pc (the unwind of the copy gives the rest). Without usable
    /// registers (the copy failed) it only ends the window. Both counted.
    #[test]
    fn pause_record_without_a_stack_goes_on_with_its_copy() {
        let mut ring = FakeRing::new(1 << 16, 1024);
        let mut s = stream(1024);
        let h = etm_bpf_common::PauseHeader {
            flags: etm_bpf_common::PAUSE_TARGET | etm_bpf_common::PAUSE_STACK_ERR,
            pid: 100,
            tid: 101,
            window_ns: 5,
            seq: 1,
            stack_len: 0,
        };
        let regs = etm_bpf_common::UserRegs {
            flags: etm_bpf_common::USTACK_REGS,
            pc: 0x400180,
            sp: 0x7ff0_0010,
            size: 4096,
            ..Default::default()
        };
        let copy = vec![0x5au8; 64];
        let failed = etm_bpf_common::UserRegs { flags: etm_bpf_common::USTACK_REGS | etm_bpf_common::USTACK_COPY_ERR, ..regs };
        for (k, (r, c)) in [(regs, &copy[..]), (failed, &[][..])].into_iter().enumerate() {
            let mut raw = vec![0u8; etm_bpf_common::pause_raw_bytes(0, Some(copy.len()))];
            let h = etm_bpf_common::PauseHeader { seq: 1 + k as u32, ..h };
            let n = h.encode_with_copy(&[], &r, c, &mut raw).unwrap();
            let sid = SampleId { id: Some(OUT_ID), ..sid(20 + k as u64) };
            ring.push_record(&build::sample_raw(&OUT_FMT, &sid, 0x400180, 1, &[], &raw[..n]));
        }
        let out = collect(&mut s, &mut ring);
        assert_eq!(out.len(), 2, "{out:?}");
        let Ev::Sample(p) = &out[0] else { panic!("{out:?}") };
        assert_eq!(p.stack, vec![0x400180]);
        assert_eq!(p.user_stack.as_ref().map(|u| (u.pc, u.bytes.clone())), Some((0x400180, copy)));
        assert!(matches!(&out[1], Ev::Side(Sideband::WindowEnd { pid: 100, cpu: 2, .. })), "{out:?}");
        assert_eq!((s.stats.pause_records, s.stats.stack_errors, s.stats.stacks_from_copy), (2, 2, 1));
    }

    /// With a target, other processes' mappings are dropped (counted) and their pause records
    /// become window ends; AUX data and the target's records pass.
    #[test]
    fn target_filter() {
        let mut ring = FakeRing::new(4096, 256);
        let mut s = stream(256);
        s.target = Some(100);
        let other = SampleId { pid: Some(555), tid: Some(555), ..sid(1) };
        let mut mm = vec![0u8; 64];
        mm[0..4].copy_from_slice(&555u32.to_le_bytes());
        ring.push_record(&build::record(types::MMAP2, 0, &mm, &FMT, &other));
        mm[0..4].copy_from_slice(&100u32.to_le_bytes());
        ring.push_record(&build::record(types::MMAP2, 0, &mm, &FMT, &sid(1)));
        ring.push_record(&pause(&other, 1, &[7]));
        ring.push_record(&pause(&sid(2), 2, &[8]));
        let off = ring.push_aux(&[1; 16]);
        ring.push_record(&build::aux(off, 16, 0, &FMT, &other));
        let out = collect(&mut s, &mut ring);
        assert_eq!(out.len(), 4, "{out:?}");
        assert!(matches!(&out[0], Ev::Side(Sideband::Mmap2 { pid: 100, .. })));
        // The other process's window still ends the CPU's window: it is forwarded as such.
        assert!(matches!(&out[1], Ev::Side(Sideband::WindowEnd { pid: 555, cpu: 2, window_ns: Some(700), .. })));
        assert!(matches!(&out[2], Ev::Sample(p) if p.pid == 100 && p.stack == vec![8]));
        assert!(matches!(&out[3], Ev::Aux(..)));
        assert_eq!((s.stats.filtered, s.stats.foreign_windows, s.stats.pause_records), (1, 1, 1));
    }

    /// Many windows through small rings: data records and AUX windows wrap repeatedly, every
    /// window's bytes arrive intact and in order.
    #[test]
    fn many_windows_wrap() {
        let mut ring = FakeRing::new(512, 256);
        let mut s = stream(256);
        let mut want = Vec::new();
        let mut got = Vec::new();
        for k in 0..50u64 {
            let w: Vec<u8> = (0..(37 + k % 50)).map(|i| (i * 7 + k) as u8).collect();
            let off = ring.push_aux(&w);
            ring.push_record(&build::aux(off, w.len() as u64, 0, &FMT, &sid(k)));
            ring.push_record(&pause(&sid(k), k as u32 + 1, &[0x1000 + k]));
            want.push(w);
            for e in collect(&mut s, &mut ring) {
                if let Ev::Aux(_, b) = e {
                    got.push(b);
                }
            }
        }
        assert_eq!(got, want);
        assert!(s.stats.data.wrapped > 0);
        assert_eq!((s.stats.aux.gap_bytes, s.stats.bad_records, s.stats.pause_records), (0, 0, 50));
        assert_eq!(s.stats.window_seq_gaps, 0);
    }

    /// TRUNCATED asks for a re-enable; a full AUX ring (head - tail = size) too; LOST records
    /// are forwarded and summed; a corrupt record is counted and the stream goes on.
    #[test]
    fn faults_are_counted() {
        let mut ring = FakeRing::new(1024, 256);
        let mut s = stream(256);
        let off = ring.push_aux(&[1; 64]);
        ring.push_record(&build::aux(off, 64, 0x1, &FMT, &sid(1)));
        ring.push_record(&build::record(
            types::LOST,
            0,
            &[&9u64.to_le_bytes()[..], &3u64.to_le_bytes()[..]].concat(),
            &FMT,
            &sid(2),
        ));
        let mut bad = build::record(types::ITRACE_START, 0, &[0; 8], &FMT, &sid(3));
        bad[0] = 12;
        bad[6] = 16; // claims 16 bytes: body + trailer no longer fit
        bad.truncate(16);
        ring.push_record(&bad);
        ring.push_record(&build::sample(&OUT_FMT, &SampleId { id: Some(999), ..sid(4) }, 1, 1, &[]));
        let out = collect(&mut s, &mut ring);
        assert_eq!(out.len(), 2);
        assert!(matches!(out[1], Ev::Side(Sideband::Lost { lost: 3, .. })));
        assert_eq!((ring.reenables, s.stats.lost, s.stats.bad_records, s.stats.unknown_samples), (1, 3, 1, 1));
        // Fill the AUX ring completely without a record: the drain sees head - tail == size.
        ring.push_aux(&[2; 256]);
        collect(&mut s, &mut ring);
        assert_eq!((ring.reenables, s.stats.aux.full), (2, 1));
        // Their record never comes (lost): the stream skipped to the head, so the ring is free
        // again and the next window is delivered normally.
        assert_eq!((ring.aux_tail(), s.stats.aux.gap_bytes), (320, 256));
        let off = ring.push_aux(&[3; 10]);
        ring.push_record(&build::aux(off, 10, 0, &FMT, &sid(5)));
        let out = collect(&mut s, &mut ring);
        assert!(matches!(&out[..], [Ev::Aux(r, b)] if r.size == 10 && b == &vec![3u8; 10]));
        assert_eq!(ring.reenables, 2);
    }

    /// Throughput of the drain (parse + AUX copy + sample conversion) per window: one 256-byte
    /// window, its AUX record and one pause sample with a 16-frame callchain per drain.
    #[test]
    #[ignore = "benchmark: cargo test --release -p etm-live --lib bench_drain -- --ignored --nocapture"]
    fn bench_drain() {
        let mut ring = FakeRing::new(1 << 16, 1 << 16);
        let mut s = stream(1 << 16);
        let w = vec![0x5au8; 256];
        let chain: Vec<u64> = (0..16).map(|i| 0x40_0000 + i * 64).collect();
        let n = 200_000u64;
        let mut sink_bytes = 0usize;
        let t0 = std::time::Instant::now();
        let mut in_drain = std::time::Duration::ZERO;
        for k in 0..n {
            let off = ring.push_aux(&w);
            ring.push_record(&build::aux(off, 256, 0x100, &FMT, &sid(k)));
            ring.push_record(&pause(&sid(k), k as u32 + 1, &chain));
            let td = std::time::Instant::now();
            s.drain(&mut ring, &mut |ev: SessionEvent<'_>| {
                if let SessionEvent::Aux { data, .. } = ev {
                    sink_bytes += data.len();
                }
            });
            in_drain += td.elapsed();
        }
        let dt = t0.elapsed();
        assert_eq!(sink_bytes as u64, 256 * n);
        eprintln!(
            "bench_drain: {n} windows; drain {:.0} ns/window ({:.1} MB/s of AUX); with producing the fake records {:.0} ns/window",
            in_drain.as_nanos() as f64 / n as f64,
            (256 * n) as f64 / in_drain.as_secs_f64() / 1e6,
            dt.as_nanos() as f64 / n as f64
        );
    }
}
