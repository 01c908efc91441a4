//! Perf records as they appear in the mmap data ring (and in the data section of perf.data).
//!
//! Layouts follow `include/uapi/linux/perf_event.h` (`enum perf_event_type`). Every record is
//! `struct perf_event_header { u32 type; u16 misc; u16 size; }` followed by a type-specific
//! body; non-SAMPLE records end with the `sample_id` trailer when `attr.sample_id_all` is set.
//! The trailer is parsed from the end of the record, as perf does, so variable-length bodies
//! (file names, comm strings) do not need to be measured first.
//!
//! Parsing never panics: a record that is shorter than its type requires returns a
//! [`RecordError`], and the ring reader ([`crate::ring`]) counts it and moves on.

use crate::bytes::{Cursor, u16_at, u32_at, u64_at};

/// `perf_event_header` size in bytes.
pub const HEADER_SIZE: usize = 8;

/// Record type numbers (`enum perf_event_type`).
pub mod types {
    pub const MMAP: u32 = 1;
    pub const LOST: u32 = 2;
    pub const COMM: u32 = 3;
    pub const EXIT: u32 = 4;
    pub const THROTTLE: u32 = 5;
    pub const UNTHROTTLE: u32 = 6;
    pub const FORK: u32 = 7;
    pub const READ: u32 = 8;
    pub const SAMPLE: u32 = 9;
    pub const MMAP2: u32 = 10;
    pub const AUX: u32 = 11;
    pub const ITRACE_START: u32 = 12;
    pub const LOST_SAMPLES: u32 = 13;
    pub const SWITCH: u32 = 14;
    pub const SWITCH_CPU_WIDE: u32 = 15;
    pub const AUX_OUTPUT_HW_ID: u32 = 21;
}

/// `PERF_SAMPLE_*` bits of `attr.sample_type`.
pub mod sample {
    pub const IP: u64 = 1 << 0;
    pub const TID: u64 = 1 << 1;
    pub const TIME: u64 = 1 << 2;
    pub const ADDR: u64 = 1 << 3;
    pub const READ: u64 = 1 << 4;
    pub const CALLCHAIN: u64 = 1 << 5;
    pub const ID: u64 = 1 << 6;
    pub const CPU: u64 = 1 << 7;
    pub const PERIOD: u64 = 1 << 8;
    pub const STREAM_ID: u64 = 1 << 9;
    pub const RAW: u64 = 1 << 10;
    pub const BRANCH_STACK: u64 = 1 << 11;
    pub const REGS_USER: u64 = 1 << 12;
    pub const STACK_USER: u64 = 1 << 13;
    pub const IDENTIFIER: u64 = 1 << 16;
}

/// `PERF_AUX_FLAG_*` bits of `PERF_RECORD_AUX.flags`.
pub mod aux_flags {
    /// The record describes less data than the PMU produced (e.g. the ETR wrapped).
    pub const TRUNCATED: u64 = 0x01;
    /// Snapshot (overwrite) mode: the AUX area was mapped read-only.
    pub const OVERWRITE: u64 = 0x02;
    /// Record contains gaps (Intel PT).
    pub const PARTIAL: u64 = 0x04;
    /// Sample collided with another (SPE).
    pub const COLLISION: u64 = 0x08;
    /// PMU-specific trace format type mask.
    pub const PMU_FORMAT_TYPE_MASK: u64 = 0xff00;
    /// CoreSight: 16-byte formatter frames (ETR/ETF/ETB).
    pub const CORESIGHT_FORMAT_CORESIGHT: u64 = 0x0000;
    /// CoreSight: raw single-source byte stream (TRBE).
    pub const CORESIGHT_FORMAT_RAW: u64 = 0x0100;
}

/// `misc` bits used here.
pub mod misc {
    pub const CPUMODE_MASK: u16 = 0x7;
    pub const KERNEL: u16 = 1;
    pub const USER: u16 = 2;
    /// COMM record caused by exec.
    pub const COMM_EXEC: u16 = 1 << 13;
    /// MMAP2 carries a build id instead of device/inode.
    pub const MMAP_BUILD_ID: u16 = 1 << 14;
    /// SWITCH: switch out (else in).
    pub const SWITCH_OUT: u16 = 1 << 13;
}

/// `PERF_CONTEXT_*` markers inside a callchain.
pub mod context {
    pub const HV: u64 = (-32i64) as u64;
    pub const KERNEL: u64 = (-128i64) as u64;
    pub const USER: u64 = (-512i64) as u64;
    pub const GUEST: u64 = (-2048i64) as u64;
    pub const GUEST_KERNEL: u64 = (-2176i64) as u64;
    pub const GUEST_USER: u64 = (-2560i64) as u64;
    pub const MAX: u64 = (-4095i64) as u64;
}

/// What the records in one ring look like: the `sample_type` shared by every event writing
/// into it, plus the attr bits that change the SAMPLE layout.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SampleFormat {
    /// `attr.sample_type`.
    pub sample_type: u64,
    /// `attr.sample_id_all`: non-SAMPLE records carry the `sample_id` trailer.
    pub sample_id_all: bool,
    /// `attr.branch_sample_type & PERF_SAMPLE_BRANCH_HW_INDEX`: branch stacks carry `hw_idx`.
    pub branch_hw_index: bool,
    /// `attr.sample_regs_user` (number of user registers = popcount).
    pub regs_user_mask: u64,
}

impl SampleFormat {
    /// Size in bytes of the `sample_id` trailer (0 without `sample_id_all`).
    pub fn trailer_len(&self) -> usize {
        if !self.sample_id_all {
            return 0;
        }
        let t = self.sample_type;
        let mut n = 0;
        for bit in [sample::TID, sample::TIME, sample::ID, sample::STREAM_ID, sample::CPU, sample::IDENTIFIER] {
            if t & bit != 0 {
                n += 8;
            }
        }
        n
    }
}

/// The `sample_id` trailer (or the matching fields of a SAMPLE).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SampleId {
    pub pid: Option<u32>,
    pub tid: Option<u32>,
    pub time: Option<u64>,
    pub id: Option<u64>,
    pub stream_id: Option<u64>,
    pub cpu: Option<u32>,
}

/// A parsed record; borrowed fields point into the record bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PerfRecord<'a> {
    /// `PERF_RECORD_MMAP`.
    Mmap { pid: u32, tid: u32, addr: u64, len: u64, pgoff: u64, filename: &'a [u8] },
    /// `PERF_RECORD_MMAP2`.
    Mmap2(Mmap2<'a>),
    /// `PERF_RECORD_COMM` (`exec` from `misc & COMM_EXEC`).
    Comm { pid: u32, tid: u32, comm: &'a [u8], exec: bool },
    /// `PERF_RECORD_FORK`.
    Fork { pid: u32, ppid: u32, tid: u32, ptid: u32, time: u64 },
    /// `PERF_RECORD_EXIT`.
    Exit { pid: u32, ppid: u32, tid: u32, ptid: u32, time: u64 },
    /// `PERF_RECORD_LOST`: `lost` records were dropped because the data ring was full.
    Lost { id: u64, lost: u64 },
    /// `PERF_RECORD_LOST_SAMPLES`.
    LostSamples { lost: u64 },
    /// `PERF_RECORD_THROTTLE` / `UNTHROTTLE`.
    Throttle { time: u64, id: u64, stream_id: u64, unthrottle: bool },
    /// `PERF_RECORD_AUX`: new AUX data at `[aux_offset, aux_offset + aux_size)`.
    Aux { aux_offset: u64, aux_size: u64, flags: u64 },
    /// `PERF_RECORD_ITRACE_START`.
    ItraceStart { pid: u32, tid: u32 },
    /// `PERF_RECORD_AUX_OUTPUT_HW_ID`: CoreSight trace ID (and sink) for the CPU in sample_id.
    AuxOutputHwId { hw_id: u64 },
    /// `PERF_RECORD_SWITCH` / `SWITCH_CPU_WIDE`.
    Switch { out: bool, next_prev: Option<(u32, u32)> },
    /// `PERF_RECORD_SAMPLE`.
    Sample(Sample<'a>),
    /// Any other type, body unparsed.
    Other { ty: u32, body: &'a [u8] },
}

/// `PERF_RECORD_MMAP2` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mmap2<'a> {
    pub pid: u32,
    pub tid: u32,
    pub addr: u64,
    pub len: u64,
    pub pgoff: u64,
    /// Device/inode identity or a build id, depending on `misc & MMAP_BUILD_ID`.
    pub file_id: Mmap2FileId<'a>,
    pub prot: u32,
    pub flags: u32,
    /// The file name, without the NUL padding.
    pub filename: &'a [u8],
}

/// The union inside MMAP2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mmap2FileId<'a> {
    Inode { maj: u32, min: u32, ino: u64, ino_generation: u64 },
    BuildId(&'a [u8]),
}

/// A SAMPLE record, for the fields of [`SampleFormat::sample_type`] up to `STACK_USER`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sample<'a> {
    pub identifier: Option<u64>,
    pub ip: Option<u64>,
    pub pid: Option<u32>,
    pub tid: Option<u32>,
    pub time: Option<u64>,
    pub addr: Option<u64>,
    pub id: Option<u64>,
    pub stream_id: Option<u64>,
    pub cpu: Option<u32>,
    pub period: Option<u64>,
    /// Callchain entries (u64 LE each), including `PERF_CONTEXT_*` markers.
    pub callchain: &'a [u8],
    /// `PERF_SAMPLE_RAW` payload (with the kernel's alignment padding).
    pub raw: &'a [u8],
    /// Branch entries, 24 bytes each (`from`, `to`, `flags`).
    pub branches: &'a [u8],
    pub branch_hw_idx: Option<u64>,
    /// `PERF_SAMPLE_STACK_USER` bytes actually copied (`dyn_size`).
    pub user_stack: &'a [u8],
}

impl<'a> Sample<'a> {
    /// All callchain entries, markers included.
    pub fn callchain(&self) -> impl Iterator<Item = u64> + 'a {
        self.callchain.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
    }

    /// The user part of the callchain (entries after `PERF_CONTEXT_USER`, markers removed).
    pub fn user_callchain(&self) -> impl Iterator<Item = u64> + 'a {
        let mut in_user = false;
        self.callchain().filter(move |&v| {
            if v >= context::MAX {
                in_user = v == context::USER;
                false
            } else {
                in_user
            }
        })
    }

    /// Branch entries `(from, to, flags)`, in kernel order (newest first).
    pub fn branch_entries(&self) -> impl Iterator<Item = (u64, u64, u64)> + 'a {
        self.branches.chunks_exact(24).map(|c| {
            let f = |o: usize| u64_at(c, o).unwrap_or(0);
            (f(0), f(8), f(16))
        })
    }
}

/// One parsed record with its header fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    /// `header.type`.
    pub ty: u32,
    /// `header.misc`.
    pub misc: u16,
    pub kind: PerfRecord<'a>,
    /// The `sample_id` trailer (all `None` when absent or for types that have none).
    pub sample_id: SampleId,
}

/// Why a record could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Fewer than 8 bytes, or `header.size` smaller than the header.
    #[error("record header too short or size {0} invalid")]
    BadHeader(usize),
    /// `header.size` larger than the bytes given.
    #[error("record size {size} exceeds the {avail} bytes available")]
    Overrun { size: usize, avail: usize },
    /// The body is too short for its type (or for the `sample_id` trailer).
    #[error("record of type {ty} is truncated ({size} bytes)")]
    Truncated { ty: u32, size: usize },
    /// A SAMPLE with a `sample_type` bit this parser does not handle (e.g. `READ`).
    #[error("unsupported sample_type bits {0:#x}")]
    UnsupportedSampleType(u64),
}

/// Reads `header.type` and `header.size` without validating the body.
pub fn peek_header(b: &[u8]) -> Option<(u32, u16, u16)> {
    Some((u32_at(b, 0)?, u16_at(b, 4)?, u16_at(b, 6)?))
}

fn parse_trailer(t: &[u8], st: u64) -> Option<SampleId> {
    let mut c = Cursor::new(t);
    let mut s = SampleId::default();
    if st & sample::TID != 0 {
        s.pid = Some(c.u32()?);
        s.tid = Some(c.u32()?);
    }
    if st & sample::TIME != 0 {
        s.time = Some(c.u64()?);
    }
    if st & sample::ID != 0 {
        s.id = Some(c.u64()?);
    }
    if st & sample::STREAM_ID != 0 {
        s.stream_id = Some(c.u64()?);
    }
    if st & sample::CPU != 0 {
        s.cpu = Some(c.u32()?);
        c.u32()?;
    }
    if st & sample::IDENTIFIER != 0 {
        s.id = Some(c.u64()?);
    }
    Some(s)
}

fn cstr(b: &[u8]) -> &[u8] {
    match b.iter().position(|&c| c == 0) {
        Some(n) => &b[..n],
        None => b,
    }
}

/// Parses one complete record (`bytes` starts at the header; extra bytes after `header.size`
/// are ignored).
pub fn parse_record<'a>(bytes: &'a [u8], fmt: &SampleFormat) -> Result<Record<'a>, RecordError> {
    let (ty, misc, size) = peek_header(bytes).ok_or(RecordError::BadHeader(bytes.len()))?;
    let size = size as usize;
    if size < HEADER_SIZE {
        return Err(RecordError::BadHeader(size));
    }
    if size > bytes.len() {
        return Err(RecordError::Overrun { size, avail: bytes.len() });
    }
    let rec = &bytes[..size];
    let trunc = RecordError::Truncated { ty, size };
    if ty == types::SAMPLE {
        let s = parse_sample(&rec[HEADER_SIZE..], fmt).ok_or(trunc)??;
        let sample_id =
            SampleId { pid: s.pid, tid: s.tid, time: s.time, id: s.id.or(s.identifier), stream_id: s.stream_id, cpu: s.cpu };
        return Ok(Record { ty, misc, kind: PerfRecord::Sample(s), sample_id });
    }
    // Kernel-generated records below carry the trailer; user types (>= 64, perf.data only)
    // and unknown types are passed through.
    let known = matches!(
        ty,
        types::MMAP
            | types::LOST
            | types::COMM
            | types::EXIT
            | types::THROTTLE
            | types::UNTHROTTLE
            | types::FORK
            | types::MMAP2
            | types::AUX
            | types::ITRACE_START
            | types::LOST_SAMPLES
            | types::SWITCH
            | types::SWITCH_CPU_WIDE
            | types::AUX_OUTPUT_HW_ID
    );
    if !known {
        return Ok(Record {
            ty,
            misc,
            kind: PerfRecord::Other { ty, body: &rec[HEADER_SIZE..] },
            sample_id: SampleId::default(),
        });
    }
    let tl = fmt.trailer_len();
    if size < HEADER_SIZE + tl {
        return Err(trunc);
    }
    let body = &rec[HEADER_SIZE..size - tl];
    let sample_id = if tl > 0 { parse_trailer(&rec[size - tl..], fmt.sample_type).ok_or(trunc)? } else { SampleId::default() };
    let kind = parse_body(ty, misc, body).ok_or(trunc)?;
    Ok(Record { ty, misc, kind, sample_id })
}

fn parse_body(ty: u32, misc: u16, body: &[u8]) -> Option<PerfRecord<'_>> {
    let mut c = Cursor::new(body);
    Some(match ty {
        types::MMAP => PerfRecord::Mmap {
            pid: c.u32()?,
            tid: c.u32()?,
            addr: c.u64()?,
            len: c.u64()?,
            pgoff: c.u64()?,
            filename: cstr(c.rest()),
        },
        types::MMAP2 => {
            let (pid, tid, addr, len, pgoff) = (c.u32()?, c.u32()?, c.u64()?, c.u64()?, c.u64()?);
            let id = c.take(24)?;
            let file_id = if misc & misc::MMAP_BUILD_ID != 0 {
                let n = (id[0] as usize).min(20);
                Mmap2FileId::BuildId(&id[4..4 + n])
            } else {
                Mmap2FileId::Inode {
                    maj: u32_at(id, 0)?,
                    min: u32_at(id, 4)?,
                    ino: u64_at(id, 8)?,
                    ino_generation: u64_at(id, 16)?,
                }
            };
            PerfRecord::Mmap2(Mmap2 {
                pid,
                tid,
                addr,
                len,
                pgoff,
                file_id,
                prot: c.u32()?,
                flags: c.u32()?,
                filename: cstr(c.rest()),
            })
        }
        types::COMM => PerfRecord::Comm { pid: c.u32()?, tid: c.u32()?, comm: cstr(c.rest()), exec: misc & misc::COMM_EXEC != 0 },
        types::FORK | types::EXIT => {
            let (pid, ppid, tid, ptid, time) = (c.u32()?, c.u32()?, c.u32()?, c.u32()?, c.u64()?);
            if ty == types::FORK {
                PerfRecord::Fork { pid, ppid, tid, ptid, time }
            } else {
                PerfRecord::Exit { pid, ppid, tid, ptid, time }
            }
        }
        types::LOST => PerfRecord::Lost { id: c.u64()?, lost: c.u64()? },
        types::LOST_SAMPLES => PerfRecord::LostSamples { lost: c.u64()? },
        types::THROTTLE | types::UNTHROTTLE => {
            PerfRecord::Throttle { time: c.u64()?, id: c.u64()?, stream_id: c.u64()?, unthrottle: ty == types::UNTHROTTLE }
        }
        types::AUX => PerfRecord::Aux { aux_offset: c.u64()?, aux_size: c.u64()?, flags: c.u64()? },
        types::ITRACE_START => PerfRecord::ItraceStart { pid: c.u32()?, tid: c.u32()? },
        types::AUX_OUTPUT_HW_ID => PerfRecord::AuxOutputHwId { hw_id: c.u64()? },
        types::SWITCH => PerfRecord::Switch { out: misc & misc::SWITCH_OUT != 0, next_prev: None },
        types::SWITCH_CPU_WIDE => PerfRecord::Switch { out: misc & misc::SWITCH_OUT != 0, next_prev: Some((c.u32()?, c.u32()?)) },
        _ => return None,
    })
}

/// Parses a SAMPLE body. Outer `None` = truncated.
fn parse_sample<'a>(body: &'a [u8], fmt: &SampleFormat) -> Option<Result<Sample<'a>, RecordError>> {
    let st = fmt.sample_type;
    if st & sample::READ != 0 {
        return Some(Err(RecordError::UnsupportedSampleType(sample::READ)));
    }
    let mut c = Cursor::new(body);
    let mut s = Sample::default();
    if st & sample::IDENTIFIER != 0 {
        s.identifier = Some(c.u64()?);
    }
    if st & sample::IP != 0 {
        s.ip = Some(c.u64()?);
    }
    if st & sample::TID != 0 {
        s.pid = Some(c.u32()?);
        s.tid = Some(c.u32()?);
    }
    if st & sample::TIME != 0 {
        s.time = Some(c.u64()?);
    }
    if st & sample::ADDR != 0 {
        s.addr = Some(c.u64()?);
    }
    if st & sample::ID != 0 {
        s.id = Some(c.u64()?);
    }
    if st & sample::STREAM_ID != 0 {
        s.stream_id = Some(c.u64()?);
    }
    if st & sample::CPU != 0 {
        s.cpu = Some(c.u32()?);
        c.u32()?;
    }
    if st & sample::PERIOD != 0 {
        s.period = Some(c.u64()?);
    }
    if st & sample::CALLCHAIN != 0 {
        let n = c.u64()?;
        let bytes = usize::try_from(n).ok()?.checked_mul(8)?;
        s.callchain = c.take(bytes)?;
    }
    if st & sample::RAW != 0 {
        let n = c.u32()? as usize;
        s.raw = c.take(n)?;
    }
    if st & sample::BRANCH_STACK != 0 {
        let n = c.u64()?;
        if fmt.branch_hw_index {
            s.branch_hw_idx = Some(c.u64()?);
        }
        let bytes = usize::try_from(n).ok()?.checked_mul(24)?;
        s.branches = c.take(bytes)?;
    }
    if st & sample::REGS_USER != 0 {
        let abi = c.u64()?;
        if abi != 0 {
            c.take(fmt.regs_user_mask.count_ones() as usize * 8)?;
        }
    }
    if st & sample::STACK_USER != 0 {
        let size = usize::try_from(c.u64()?).ok()?;
        let data = c.take(size)?;
        if size > 0 {
            let dyn_size = usize::try_from(c.u64()?).ok()?;
            s.user_stack = &data[..dyn_size.min(size)];
        }
    }
    Some(Ok(s))
}

/// Decodes `PERF_RECORD_AUX_OUTPUT_HW_ID.hw_id` (CoreSight layout, etm-interface.md §1.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CsHwId {
    /// Trace ID, bits [7:0] (version 0.0 used bits [6:0] of the same field).
    pub trace_id: u8,
    /// Sink ID, bits [39:8] (version >= 0.1 only).
    pub sink_id: Option<u32>,
    pub major: u8,
    pub minor: u8,
}

impl CsHwId {
    pub fn decode(hw_id: u64) -> Self {
        let major = ((hw_id >> 60) & 0xf) as u8;
        let minor = ((hw_id >> 56) & 0xf) as u8;
        let sink_id = if major > 0 || minor >= 1 { Some(((hw_id >> 8) & 0xffff_ffff) as u32) } else { None };
        CsHwId { trace_id: (hw_id & 0xff) as u8, sink_id, major, minor }
    }
}

/// Builders for records, used by tests here and by the fake rings of the live driver's tests.
pub mod build {
    use super::*;

    /// Appends a record of type `ty` with `body` and the `sample_id` trailer for `fmt`.
    pub fn record(ty: u32, misc: u16, body: &[u8], fmt: &SampleFormat, id: &SampleId) -> Vec<u8> {
        let mut v = Vec::with_capacity(64);
        v.extend_from_slice(&ty.to_le_bytes());
        v.extend_from_slice(&misc.to_le_bytes());
        v.extend_from_slice(&0u16.to_le_bytes());
        v.extend_from_slice(body);
        while v.len() % 8 != 0 {
            v.push(0);
        }
        if fmt.sample_id_all && ty != types::SAMPLE {
            trailer(&mut v, fmt.sample_type, id);
        }
        let n = v.len() as u16;
        v[6..8].copy_from_slice(&n.to_le_bytes());
        v
    }

    fn trailer(v: &mut Vec<u8>, st: u64, id: &SampleId) {
        if st & sample::TID != 0 {
            v.extend_from_slice(&id.pid.unwrap_or(0).to_le_bytes());
            v.extend_from_slice(&id.tid.unwrap_or(0).to_le_bytes());
        }
        if st & sample::TIME != 0 {
            v.extend_from_slice(&id.time.unwrap_or(0).to_le_bytes());
        }
        if st & sample::ID != 0 {
            v.extend_from_slice(&id.id.unwrap_or(0).to_le_bytes());
        }
        if st & sample::STREAM_ID != 0 {
            v.extend_from_slice(&id.stream_id.unwrap_or(0).to_le_bytes());
        }
        if st & sample::CPU != 0 {
            v.extend_from_slice(&id.cpu.unwrap_or(0).to_le_bytes());
            v.extend_from_slice(&0u32.to_le_bytes());
        }
        if st & sample::IDENTIFIER != 0 {
            v.extend_from_slice(&id.id.unwrap_or(0).to_le_bytes());
        }
    }

    /// `PERF_RECORD_AUX`.
    pub fn aux(aux_offset: u64, aux_size: u64, flags: u64, fmt: &SampleFormat, id: &SampleId) -> Vec<u8> {
        let mut b = Vec::with_capacity(24);
        for x in [aux_offset, aux_size, flags] {
            b.extend_from_slice(&x.to_le_bytes());
        }
        record(types::AUX, 0, &b, fmt, id)
    }

    /// A SAMPLE with IDENTIFIER/IP/TID/TIME/CPU/PERIOD/CALLCHAIN as far as `fmt` asks for them.
    pub fn sample(fmt: &SampleFormat, id: &SampleId, ip: u64, period: u64, callchain: &[u64]) -> Vec<u8> {
        sample_raw(fmt, id, ip, period, callchain, &[])
    }

    /// [`sample`] plus PERF_SAMPLE_RAW if `fmt` asks for it: `u32 size` and the bytes, padded
    /// with zeros so that size field and bytes end on 8 bytes (`perf_sample_save_raw_data`:
    /// `raw->size = round_up(sum + sizeof(u32), sizeof(u64)) - sizeof(u32)`).
    pub fn sample_raw(fmt: &SampleFormat, id: &SampleId, ip: u64, period: u64, callchain: &[u64], raw: &[u8]) -> Vec<u8> {
        let st = fmt.sample_type;
        let mut b = Vec::new();
        if st & sample::IDENTIFIER != 0 {
            b.extend_from_slice(&id.id.unwrap_or(0).to_le_bytes());
        }
        if st & sample::IP != 0 {
            b.extend_from_slice(&ip.to_le_bytes());
        }
        if st & sample::TID != 0 {
            b.extend_from_slice(&id.pid.unwrap_or(0).to_le_bytes());
            b.extend_from_slice(&id.tid.unwrap_or(0).to_le_bytes());
        }
        if st & sample::TIME != 0 {
            b.extend_from_slice(&id.time.unwrap_or(0).to_le_bytes());
        }
        if st & sample::ID != 0 {
            b.extend_from_slice(&id.id.unwrap_or(0).to_le_bytes());
        }
        if st & sample::CPU != 0 {
            b.extend_from_slice(&id.cpu.unwrap_or(0).to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
        }
        if st & sample::PERIOD != 0 {
            b.extend_from_slice(&period.to_le_bytes());
        }
        if st & sample::CALLCHAIN != 0 {
            b.extend_from_slice(&(callchain.len() as u64).to_le_bytes());
            for x in callchain {
                b.extend_from_slice(&x.to_le_bytes());
            }
        }
        if st & sample::RAW != 0 {
            let size = (raw.len() + 4).next_multiple_of(8) - 4;
            b.extend_from_slice(&(size as u32).to_le_bytes());
            b.extend_from_slice(raw);
            b.resize(b.len() + size - raw.len(), 0);
        }
        record(types::SAMPLE, misc::USER, &b, fmt, id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FMT: SampleFormat = SampleFormat {
        sample_type: sample::IDENTIFIER
            | sample::IP
            | sample::TID
            | sample::TIME
            | sample::CPU
            | sample::PERIOD
            | sample::CALLCHAIN,
        sample_id_all: true,
        branch_hw_index: false,
        regs_user_mask: 0,
    };

    fn le(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    /// A hand-assembled PERF_RECORD_AUX (uapi order: offset, size, flags, then the trailer
    /// TID, TIME, CPU, IDENTIFIER) decodes field by field.
    #[test]
    fn aux_record_hand_assembled() {
        let b = le(&[
            &11u32.to_le_bytes(),
            &0u16.to_le_bytes(),
            &64u16.to_le_bytes(),
            &0x1000u64.to_le_bytes(),
            &0x230u64.to_le_bytes(),
            &0x101u64.to_le_bytes(),
            &7u32.to_le_bytes(),
            &8u32.to_le_bytes(),
            &123456789u64.to_le_bytes(),
            &3u32.to_le_bytes(),
            &0u32.to_le_bytes(),
            &42u64.to_le_bytes(),
        ]);
        let r = parse_record(&b, &FMT).unwrap();
        assert_eq!(r.kind, PerfRecord::Aux { aux_offset: 0x1000, aux_size: 0x230, flags: 0x101 });
        assert_eq!(
            r.sample_id,
            SampleId { pid: Some(7), tid: Some(8), time: Some(123456789), id: Some(42), stream_id: None, cpu: Some(3) }
        );
    }

    /// A SAMPLE with a callchain: the user part is the entries after PERF_CONTEXT_USER.
    #[test]
    fn sample_with_callchain() {
        let chain = [context::KERNEL, 0xffff_8000_1000_0000, context::USER, 0x400100, 0x400200];
        let mut body = le(&[
            &9u64.to_le_bytes(),
            &0x400100u64.to_le_bytes(),
            &10u32.to_le_bytes(),
            &11u32.to_le_bytes(),
            &555u64.to_le_bytes(),
            &1u32.to_le_bytes(),
            &0u32.to_le_bytes(),
            &1000u64.to_le_bytes(),
            &5u64.to_le_bytes(),
        ]);
        for c in chain {
            body.extend_from_slice(&c.to_le_bytes());
        }
        let mut b = le(&[&9u32.to_le_bytes(), &2u16.to_le_bytes(), &((8 + body.len()) as u16).to_le_bytes()]);
        b.extend_from_slice(&body);
        let r = parse_record(&b, &FMT).unwrap();
        let PerfRecord::Sample(s) = &r.kind else { panic!() };
        assert_eq!(
            (s.identifier, s.ip, s.pid, s.tid, s.time, s.cpu, s.period),
            (Some(9), Some(0x400100), Some(10), Some(11), Some(555), Some(1), Some(1000))
        );
        assert_eq!(s.user_callchain().collect::<Vec<_>>(), vec![0x400100, 0x400200]);
        assert_eq!(s.callchain().count(), 5);
        assert_eq!(r.sample_id.id, Some(9));
        // The builder used by the fake rings produces the same bytes.
        let id = SampleId { pid: Some(10), tid: Some(11), time: Some(555), id: Some(9), stream_id: None, cpu: Some(1) };
        assert_eq!(build::sample(&FMT, &id, 0x400100, 1000, &chain), b);
    }

    /// Truncated records of every kernel type are errors, never panics, at every cut length.
    #[test]
    fn truncation_never_panics() {
        let id = SampleId { pid: Some(1), tid: Some(2), time: Some(3), id: Some(4), stream_id: None, cpu: Some(5) };
        let recs = vec![
            build::aux(1, 2, 3, &FMT, &id),
            build::record(types::ITRACE_START, 0, &[1, 0, 0, 0, 2, 0, 0, 0], &FMT, &id),
            build::record(types::AUX_OUTPUT_HW_ID, 0, &0x0100_0000_0000_1234u64.to_le_bytes(), &FMT, &id),
            build::record(types::LOST, 0, &[0; 16], &FMT, &id),
            build::record(types::FORK, 0, &[0; 24], &FMT, &id),
            build::record(types::MMAP2, 0, &[0; 72], &FMT, &id),
            build::sample(&FMT, &id, 1, 2, &[context::USER, 9]),
        ];
        assert!(parse_record(&[0xff; 40], &FMT).is_err());
        for r in &recs {
            assert!(parse_record(r, &FMT).is_ok());
            for cut in 0..r.len() {
                let mut t = r[..cut].to_vec();
                // Also lie in the header: claim the shortened size.
                if cut >= 8 {
                    t[6..8].copy_from_slice(&(cut as u16).to_le_bytes());
                }
                let _ = parse_record(&t, &FMT);
            }
        }
        // A header claiming more than is there is an overrun, a zero size a bad header.
        let mut r = build::aux(1, 2, 3, &FMT, &id);
        assert!(matches!(parse_record(&r[..30], &FMT), Err(RecordError::Overrun { .. })));
        r[6] = 0;
        r[7] = 0;
        assert!(matches!(parse_record(&r, &FMT), Err(RecordError::BadHeader(0))));
        // ITRACE_START whose size leaves no room for the body after the trailer.
        let short = build::record(types::ITRACE_START, 0, &[], &FMT, &id);
        assert!(matches!(parse_record(&short, &FMT), Err(RecordError::Truncated { ty: 12, .. })));
    }

    /// The hw_id layout of etm-interface.md §1.9: trace ID [7:0], sink [39:8], version [63:56].
    #[test]
    fn hw_id_decode() {
        let v01 = (1u64 << 56) | (0xabcd_ef01 << 8) | 0x23;
        assert_eq!(CsHwId::decode(v01), CsHwId { trace_id: 0x23, sink_id: Some(0xabcd_ef01), major: 0, minor: 1 });
        assert_eq!(CsHwId::decode(0x11), CsHwId { trace_id: 0x11, sink_id: None, major: 0, minor: 0 });
    }

    /// MMAP2 with a build id (misc MMAP_BUILD_ID) exposes the id bytes, not inode fields.
    #[test]
    fn mmap2_build_id() {
        let mut body = Vec::new();
        for v in [5u32, 6] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        for v in [0x1000u64, 0x2000, 0] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        let mut u = [0u8; 24];
        u[0] = 20;
        for (i, b) in u[4..24].iter_mut().enumerate() {
            *b = i as u8 + 1;
        }
        body.extend_from_slice(&u);
        body.extend_from_slice(&5u32.to_le_bytes());
        body.extend_from_slice(&2u32.to_le_bytes());
        body.extend_from_slice(b"/bin/x\0\0");
        let r = build::record(types::MMAP2, misc::MMAP_BUILD_ID, &body, &FMT, &SampleId::default());
        let PerfRecord::Mmap2(m) = parse_record(&r, &FMT).unwrap().kind else { panic!() };
        assert_eq!(m.file_id, Mmap2FileId::BuildId(&u[4..24]));
        assert_eq!((m.addr, m.len, m.prot, m.filename), (0x1000, 0x2000, 5, &b"/bin/x"[..]));
    }

    /// SAMPLE with READ in sample_type is refused rather than misparsed.
    #[test]
    fn unsupported_sample_type() {
        let fmt = SampleFormat { sample_type: sample::READ, ..FMT };
        let r = build::record(types::SAMPLE, 0, &[0; 16], &fmt, &SampleId::default());
        assert_eq!(parse_record(&r, &fmt), Err(RecordError::UnsupportedSampleType(sample::READ)));
    }
}
