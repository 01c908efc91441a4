//! The session directory: everything the pipeline consumed, on disk, so that a live run can be
//! replayed and a synthetic run can be generated without ARM hardware.
//!
//! This module is the only place in `etm-session` that does file I/O; the I/O happens in
//! explicit functions ([`SessionWriter::create`], [`SessionReader::open`], ...).
//!
//! # On-disk layout (format version 1)
//!
//! ```text
//! DIR/
//!   session.json        metadata (SessionMeta): source, target, per-CPU trace configuration
//!                       (ETMv4/ETE ID registers, TRCCONFIGR, trace ID), clock parameters,
//!                       branch depth, window parameters, code images
//!   events.jsonl        one JSON object per line (EventRecord), in the order the live driver
//!                       received them: AUX records (pointing into aux/cpuN.bin), pause
//!                       samples, sideband records
//!   aux/cpu<N>.bin      raw AUX bytes of CPU N (the AUX buffer of the perf event of that CPU,
//!                       or the per-thread buffer when cpu = -1 -> aux/cpu-1.bin), concatenated
//!                       in record order; an `aux` line says where each record's bytes are
//!   images/<file>       copies of code images (synthetic sessions always copy; live sessions
//!                       copy when `run --record` was asked to, otherwise only path+build-id)
//!   ustack.bin          the pause samples' user-stack copies (`--unwind dwarf|auto` with ETM),
//!                       concatenated; absent when no sample has one
//! ```
//!
//! `events.jsonl` lines are internally tagged by `"type"`:
//!
//! ```text
//! {"type":"aux","cpu":0,"offset":0,"size":4096,"flags":256,"time":123,"aux_offset":0}
//! {"type":"sample","cpu":0,"pid":7,"tid":7,"time":130,"stack":[4196,4300],"branches":null}
//! {"type":"mmap2","pid":7,"tid":7,"addr":4194304,"len":8192,"pgoff":0,"prot":5,"flags":2,
//!  "filename":"/bin/prog","build_id":"ab12..","time":0,"cpu":null}
//! {"type":"comm","pid":7,"tid":7,"comm":"prog","exec":true,"time":0,"cpu":null}
//! {"type":"fork"|"exit","pid":..,"ppid":..,"tid":..,"ptid":..,"time":..,"cpu":..}
//! {"type":"lost","id":..,"lost":..,"time":..,"cpu":..}
//! {"type":"itrace_start","pid":..,"tid":..,"time":..,"cpu":..}
//! {"type":"aux_output_hw_id","hw_id":..,"time":..,"cpu":..}
//! ```
//!
//! * `aux.offset`/`aux.size` are the byte range in `aux/cpu<cpu>.bin`; `aux.flags` are the
//!   `PERF_RECORD_AUX` flags (0x01 truncated, 0x02 overwrite, 0x04 partial, 0x08 collision,
//!   0x0100 CoreSight raw format, i.e. no 16-byte frame formatter); `aux.time` is the record's
//!   `sample_id.time` in the perf clock; `aux_offset` is the record's `aux_offset` (the
//!   monotonic AUX ring position where its data starts): a record that does not start where
//!   the previous one of its CPU ended follows lost data, and the pipeline restarts decoding
//!   there (0 = not provided, no check).
//! * `sample.stack` is leaf first (`[0]` = sampled IP, then return addresses), runtime virtual
//!   addresses; `sample.branches` is `null` (no branch unit: ETM or stack-only) or the
//!   LBR/BRBE records carried by the sample, newest first (`[]`: the kernel gave none);
//!   `sample.branch_flags` (optional) is each record's `perf_branch_entry` flag word.
//!   `sample.ustack` (optional) is the user registers the stack copy starts from
//!   (`flags`, `pc`, `sp`, `fp`, `lr`, the copy's size class `size`) and where its bytes are
//!   (`offset`, `len` in `ustack.bin`); `stack` is then the frame-pointer stack, and the
//!   reader of a recording unwinds the copy as the live run did.
//! * `session.json`'s `arch` (`aarch64`, `x86_64`) is the instruction set the code checks
//!   decode; absent in older recordings (ETM sessions: AArch64).
//! * Times are perf-clock nanoseconds. ETM timestamps in the AUX data are converted with
//!   `session.json`'s `clock` (perf's `tsc_to_perf_time` formula); `clock: null` means the
//!   trace timestamps are already perf-clock nanoseconds (synthetic sessions).
//! * Numbers are plain JSON integers (u64 addresses round-trip exactly through serde_json).
//!
//! Reading is fault tolerant: a malformed `events.jsonl` line is counted and skipped, an AUX
//! record whose bytes are missing from `aux/cpuN.bin` (truncated file) yields the bytes that
//! exist and is counted ([`ReaderStats`]).

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Current format version written to `session.json`.
pub const FORMAT_VERSION: u32 = 1;
/// `session.json` file name.
pub const META_FILE: &str = "session.json";
/// Event stream file name.
pub const EVENTS_FILE: &str = "events.jsonl";
/// AUX data directory.
pub const AUX_DIR: &str = "aux";
/// Copied code images directory.
pub const IMAGES_DIR: &str = "images";
/// The pause samples' user-stack copies, concatenated (`ustack` fields point into it).
pub const USTACK_FILE: &str = "ustack.bin";

/// `PERF_RECORD_AUX` flag: data was lost (the kernel also disabled the event).
pub const PERF_AUX_FLAG_TRUNCATED: u64 = 0x01;
/// `PERF_RECORD_AUX` flag: snapshot/overwrite mode.
pub const PERF_AUX_FLAG_OVERWRITE: u64 = 0x02;
/// `PERF_RECORD_AUX` flag: partial record (Intel PT).
pub const PERF_AUX_FLAG_PARTIAL: u64 = 0x04;
/// `PERF_RECORD_AUX` flag: sample collision (SPE).
pub const PERF_AUX_FLAG_COLLISION: u64 = 0x08;
/// `PERF_RECORD_AUX` PMU format type mask.
pub const PERF_AUX_FLAG_PMU_FORMAT_TYPE_MASK: u64 = 0xff00;
/// CoreSight raw format (TRBE: no frame formatter).
pub const PERF_AUX_FLAG_CORESIGHT_FORMAT_RAW: u64 = 0x0100;

/// Errors of session directory I/O.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// A file of the session could not be read or written.
    #[error("session file {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// `session.json` is not valid.
    #[error("invalid {path}")]
    Meta {
        /// The file.
        path: PathBuf,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// The format version is newer than this reader.
    #[error("unsupported session format version {0} (this build reads up to {FORMAT_VERSION})")]
    Version(u32),
    /// An image to copy has no file name.
    #[error("code image path {0} has no file name")]
    ImageName(PathBuf),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SessionError + '_ {
    move |source| SessionError::Io { path: path.to_path_buf(), source }
}

/// Where the session came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SessionSource {
    /// Recorded by `etm-bpf run --record`.
    #[default]
    Live,
    /// Generated by `etm-bpf synth` (ground truth alongside).
    Synthetic,
}

/// The profiled target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TargetInfo {
    /// Process id (-1 when system-wide).
    pub pid: i64,
    /// Command line (argv).
    pub command: Vec<String>,
}

/// Which trace architecture a CPU's trace unit implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TraceArch {
    /// ETMv4 (IHI 0064).
    Etmv4,
    /// ETE (DDI 0608).
    #[default]
    Ete,
}

/// Trace configuration of one CPU: the register values a decoder needs (perf's AUXTRACE_INFO
/// per-CPU block, see etm-interface.md §1.8).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CpuTraceConfig {
    /// CPU number.
    pub cpu: i32,
    /// ETMv4 or ETE.
    pub arch: TraceArch,
    /// Trace ID (TRCTRACEIDR & 0x7f, or from AUX_OUTPUT_HW_ID).
    pub trace_id: u8,
    /// Sink ID from AUX_OUTPUT_HW_ID v0.1, if known.
    #[serde(default)]
    pub sink_id: Option<u32>,
    /// TRCCONFIGR as synthesised from the attr bits.
    pub trcconfigr: u32,
    /// TRCIDR0.
    pub trcidr0: u32,
    /// TRCIDR1.
    pub trcidr1: u32,
    /// TRCIDR2.
    pub trcidr2: u32,
    /// TRCIDR8.
    pub trcidr8: u32,
    /// TRCAUTHSTATUS.
    #[serde(default)]
    pub trcauthstatus: u32,
    /// TRCDEVARCH (ETE; 0 for ETMv4 when not read).
    #[serde(default)]
    pub trcdevarch: u32,
    /// `ts_source` (-1 unknown, 1 virtual, 2 guest-physical, 3 physical).
    #[serde(default)]
    pub ts_source: i32,
}

/// Clock conversion parameters from the perf mmap page (etm-interface.md §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ClockParams {
    /// `time_zero`.
    pub time_zero: u64,
    /// `time_mult`.
    pub time_mult: u32,
    /// `time_shift`.
    pub time_shift: u16,
    /// `time_cycles` (when `cap_user_time_short`).
    #[serde(default)]
    pub time_cycles: u64,
    /// `time_mask` (when `cap_user_time_short`).
    #[serde(default)]
    pub time_mask: u64,
    /// `cap_user_time_short`.
    #[serde(default)]
    pub cap_user_time_short: bool,
}

impl ClockParams {
    /// Convert a counter value to perf-clock nanoseconds (perf `tsc_to_perf_time`).
    pub fn to_perf_time(&self, mut cyc: u64) -> u64 {
        if self.cap_user_time_short {
            cyc = self.time_cycles.wrapping_add(cyc.wrapping_sub(self.time_cycles) & self.time_mask);
        }
        let shift = u32::from(self.time_shift).min(63);
        let quot = cyc >> shift;
        let rem = cyc & ((1u64 << shift) - 1);
        let mult = u64::from(self.time_mult);
        self.time_zero.wrapping_add(quot.wrapping_mul(mult)).wrapping_add(rem.wrapping_mul(mult) >> shift)
    }
}

/// How trace windows were opened and closed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct WindowParams {
    /// Mode: `hw`, `free`, `strobe` (autofdo preset), `synthetic`, `none` (no ETM).
    pub mode: String,
    /// Unit of the two numbers below: `cycles` or `instructions`.
    pub unit: String,
    /// Window length (pause period in hw mode; instructions in synthetic sessions).
    pub window: u64,
    /// Period between window starts (the resume period).
    pub period: u64,
}

/// A code image the session references.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CodeImage {
    /// Path of the binary on the recording machine (as in MMAP2 `filename`).
    pub path: String,
    /// GNU build-id, lowercase hex, if known.
    #[serde(default)]
    pub build_id: Option<String>,
    /// Path of the copy relative to the session directory (`images/...`), if copied.
    #[serde(default)]
    pub copy: Option<String>,
}

/// The instruction set of the profiled code: what the join's code checks decode (A64 words
/// or x86-64 instructions). Recorded by the live driver from the host it ran on, so a replay
/// validates a recording the same way the live run did, on any machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CodeArch {
    /// AArch64 (A64 instructions; ETM/ETE, BRBE).
    #[serde(rename = "aarch64")]
    Aarch64,
    /// x86-64 (Intel LBR, Arch LBR, AMD LBRv2).
    #[serde(rename = "x86_64")]
    X86_64,
}

impl CodeArch {
    /// From an ELF file's `e_machine` (`None`: another architecture, or not ELF).
    pub fn of_elf(data: &[u8]) -> Option<CodeArch> {
        use object::Object;
        match object::File::parse(data).ok()?.architecture() {
            object::Architecture::Aarch64 => Some(CodeArch::Aarch64),
            object::Architecture::X86_64 => Some(CodeArch::X86_64),
            _ => None,
        }
    }

    /// The architecture this program was built for, if it is one the checks know.
    pub fn host() -> Option<CodeArch> {
        if cfg!(target_arch = "aarch64") {
            Some(CodeArch::Aarch64)
        } else if cfg!(target_arch = "x86_64") {
            Some(CodeArch::X86_64)
        } else {
            None
        }
    }

    /// The name used in `session.json`.
    pub fn name(self) -> &'static str {
        match self {
            CodeArch::Aarch64 => "aarch64",
            CodeArch::X86_64 => "x86_64",
        }
    }
}

/// `session.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SessionMeta {
    /// Format version ([`FORMAT_VERSION`]).
    pub version: u32,
    /// Live or synthetic.
    pub source: SessionSource,
    /// The profiled target.
    pub target: TargetInfo,
    /// Per-CPU trace configuration (empty when the session has no ETM data).
    pub cpus: Vec<CpuTraceConfig>,
    /// Clock parameters; `None` = trace timestamps are perf-clock ns already.
    #[serde(default)]
    pub clock: Option<ClockParams>,
    /// Branch records kept per sample (last-branch depth).
    pub branch_depth: u32,
    /// Window parameters.
    pub window: WindowParams,
    /// Code images.
    #[serde(default)]
    pub images: Vec<CodeImage>,
    /// Free-form notes (generator version, host, ...).
    #[serde(default)]
    pub notes: HashMap<String, String>,
    /// The instruction set of the recorded code. Absent in recordings made before it was
    /// recorded: sessions with ETM data are AArch64; others are replayed without code checks
    /// of branch records (counted unverified).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<CodeArch>,
}

/// A branch record `{from, to}` (runtime addresses): the one branch type of the crates,
/// `etm_decode::branches::BranchRecord` (serialized as `{"from": .., "to": ..}`).
pub use etm_decode::branches::BranchRecord as BranchPair;

/// A pause (or plain sampling) sample: what the eBPF program captured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PauseSample {
    /// CPU the sample was taken on.
    pub cpu: i32,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Perf-clock time (ns).
    pub time: u64,
    /// User stack, leaf first.
    pub stack: Vec<u64>,
    /// LBR/BRBE records carried by the sample (newest first), or `None`. `Some` and empty:
    /// the event had a branch stack and the kernel gave no entry.
    #[serde(default)]
    pub branches: Option<Vec<BranchPair>>,
    /// The flag word of each of `branches` (the third u64 of the kernel's `struct
    /// perf_branch_entry`: mispred, predicted, in_tx, abort, cycles, type, spec, new_type,
    /// priv), same order; empty when the source gives none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub branch_flags: Vec<u64>,
    /// Length of the trace window this pause closed (ns, measured by the eBPF programs
    /// between the resume and the pause), if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ns: Option<u64>,
    /// The user registers and the top of the user stack the pause program copied
    /// (`--unwind dwarf|auto`): the stack is DWARF-unwound from them before the join
    /// (`stack` holds the frame-pointer one). Recorded as an `ustack` field and bytes in
    /// `ustack.bin` ([`SessionWriter::write_sample`]).
    #[serde(skip)]
    pub user_stack: Option<UserStack>,
}

/// Registers and stack bytes of a [`PauseSample`] for DWARF unwinding (the fields of the eBPF
/// program's `UserRegs`: x86-64 `pc` = ip, `fp` = bp; AArch64 `fp` = x29, `lr` = x30).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UserStack {
    /// `UserRegs` flags (`USTACK_*`).
    pub flags: u32,
    pub pc: u64,
    pub sp: u64,
    pub fp: u64,
    pub lr: u64,
    /// The size class of the copy (`--stack-size`).
    pub size: u32,
    /// The bytes copied from `sp` up.
    pub bytes: Vec<u8>,
}

/// The `ustack` field of a sample line: [`UserStack`] without its bytes, which are
/// `ustack.bin[offset..offset + len]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct UstackLine {
    flags: u32,
    pc: u64,
    sp: u64,
    fp: u64,
    lr: u64,
    size: u32,
    offset: u64,
    len: u64,
}

/// What a sample line is parsed for a second time when it has an `ustack` field.
#[derive(Deserialize)]
struct UstackOnly {
    ustack: UstackLine,
}

/// Sideband perf records (the fields the pipeline uses).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Sideband {
    /// `PERF_RECORD_MMAP2`.
    Mmap2 {
        /// Process id.
        pid: u32,
        /// Thread id.
        tid: u32,
        /// Start address.
        addr: u64,
        /// Length.
        len: u64,
        /// File offset.
        pgoff: u64,
        /// Protection bits.
        #[serde(default)]
        prot: u32,
        /// Flags.
        #[serde(default)]
        flags: u32,
        /// File name.
        filename: String,
        /// Build-id (hex) if the record carried one.
        #[serde(default)]
        build_id: Option<String>,
        /// Time.
        #[serde(default)]
        time: u64,
        /// CPU (sample_id).
        #[serde(default)]
        cpu: Option<i32>,
    },
    /// `PERF_RECORD_COMM`.
    Comm {
        /// Process id.
        pid: u32,
        /// Thread id.
        tid: u32,
        /// New command name.
        comm: String,
        /// Set by exec.
        #[serde(default)]
        exec: bool,
        /// Time.
        #[serde(default)]
        time: u64,
        /// CPU.
        #[serde(default)]
        cpu: Option<i32>,
    },
    /// `PERF_RECORD_FORK`.
    Fork {
        /// Process id.
        pid: u32,
        /// Parent process id.
        ppid: u32,
        /// Thread id.
        tid: u32,
        /// Parent thread id.
        ptid: u32,
        /// Time.
        #[serde(default)]
        time: u64,
        /// CPU.
        #[serde(default)]
        cpu: Option<i32>,
    },
    /// `PERF_RECORD_EXIT`.
    Exit {
        /// Process id.
        pid: u32,
        /// Parent process id.
        ppid: u32,
        /// Thread id.
        tid: u32,
        /// Parent thread id.
        ptid: u32,
        /// Time.
        #[serde(default)]
        time: u64,
        /// CPU.
        #[serde(default)]
        cpu: Option<i32>,
    },
    /// `PERF_RECORD_LOST`: records the kernel dropped from the data ring.
    Lost {
        /// Event id.
        #[serde(default)]
        id: u64,
        /// Number of lost records.
        lost: u64,
        /// Time.
        #[serde(default)]
        time: u64,
        /// CPU.
        #[serde(default)]
        cpu: Option<i32>,
    },
    /// `PERF_RECORD_ITRACE_START`.
    ItraceStart {
        /// Process id.
        pid: u32,
        /// Thread id.
        tid: u32,
        /// Time.
        #[serde(default)]
        time: u64,
        /// CPU.
        #[serde(default)]
        cpu: Option<i32>,
    },
    /// `PERF_RECORD_AUX_OUTPUT_HW_ID`.
    AuxOutputHwId {
        /// Raw hw_id (trace ID in bits 7:0, sink ID 39:8, version 63:56).
        hw_id: u64,
        /// Time.
        #[serde(default)]
        time: u64,
        /// CPU.
        #[serde(default)]
        cpu: Option<i32>,
    },
    /// `PERF_RECORD_THROTTLE` / `UNTHROTTLE` of a group leader (`perf_log_throttle`, written
    /// only for the leader): the kernel stopped (or restarted) the whole group of `cpu`
    /// (`perf_event_throttle_group`); trace between the two is lost.
    Throttle {
        /// Leader event id.
        #[serde(default)]
        id: u64,
        /// The group was restarted (UNTHROTTLE) rather than stopped.
        unthrottle: bool,
        /// Time.
        time: u64,
        /// CPU (sample_id).
        #[serde(default)]
        cpu: Option<i32>,
    },
    /// `PERF_RECORD_SWITCH` / `SWITCH_CPU_WIDE`: a context switch on `cpu`. `pid`/`tid` are
    /// the task the record is about (sample_id: the one switched out, or in); for CPU-wide
    /// records `next_prev` is the task on the other side of the switch.
    Switch {
        /// Switch out (true) or in.
        out: bool,
        /// Process id (sample_id).
        pid: u32,
        /// Thread id (sample_id).
        tid: u32,
        /// The other task (CPU-wide records): (pid, tid).
        #[serde(default)]
        next_prev: Option<(u32, u32)>,
        /// Time.
        time: u64,
        /// CPU.
        #[serde(default)]
        cpu: Option<i32>,
    },
    /// A trace window closed by the pause of another process on `cpu` (the pause program's
    /// header-only record): the trace up to `time` on that CPU belongs to no sample of the
    /// target.
    WindowEnd {
        /// Process of the interrupted task.
        pid: u32,
        /// Thread.
        tid: u32,
        /// Window length (ns, from the eBPF clock).
        #[serde(default)]
        window_ns: Option<u64>,
        /// Perf-clock time of the pause.
        time: u64,
        /// CPU.
        cpu: i32,
    },
    /// The live driver proved that every trace byte of `cpu` (all CPUs with `None`) up to
    /// `time` has been handed to the pipeline (it disabled the groups, which makes every sink
    /// publish its data, and drained the rings): pending samples before `time` can be joined.
    TraceComplete {
        /// CPU, or all.
        #[serde(default)]
        cpu: Option<i32>,
        /// Perf-clock time.
        time: u64,
    },
}

impl Sideband {
    /// The record's time.
    pub fn time(&self) -> u64 {
        match self {
            Sideband::Mmap2 { time, .. }
            | Sideband::Comm { time, .. }
            | Sideband::Fork { time, .. }
            | Sideband::Exit { time, .. }
            | Sideband::Lost { time, .. }
            | Sideband::ItraceStart { time, .. }
            | Sideband::AuxOutputHwId { time, .. }
            | Sideband::Throttle { time, .. }
            | Sideband::Switch { time, .. }
            | Sideband::WindowEnd { time, .. }
            | Sideband::TraceComplete { time, .. } => *time,
        }
    }

    /// The record's perf-clock time, to change (a replay shifted in time).
    pub fn time_mut(&mut self) -> &mut u64 {
        match self {
            Sideband::Mmap2 { time, .. }
            | Sideband::Comm { time, .. }
            | Sideband::Fork { time, .. }
            | Sideband::Exit { time, .. }
            | Sideband::Lost { time, .. }
            | Sideband::ItraceStart { time, .. }
            | Sideband::AuxOutputHwId { time, .. }
            | Sideband::Throttle { time, .. }
            | Sideband::Switch { time, .. }
            | Sideband::WindowEnd { time, .. }
            | Sideband::TraceComplete { time, .. } => time,
        }
    }
}

/// Header of one AUX record (the `PERF_RECORD_AUX` fields plus the CPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct AuxRecord {
    /// CPU of the AUX buffer (-1 for a per-thread buffer).
    pub cpu: i32,
    /// `PERF_RECORD_AUX` flags.
    pub flags: u64,
    /// Perf-clock time of the record.
    pub time: u64,
    /// Monotonic AUX ring position where the data starts (`PERF_RECORD_AUX.aux_offset`);
    /// 0 = unknown.
    #[serde(default)]
    pub aux_offset: u64,
    /// Size the kernel announced; the data handed over may be shorter if bytes were lost
    /// (the reader sets it from the line, so a truncated `aux/cpuN.bin` shows up as short).
    #[serde(default)]
    pub size: u64,
    /// CPU that wrote the data (`sample_id.cpu` of the record), where it differs from the
    /// buffer's: in a per-thread buffer every CPU the thread ran on writes fragments, and raw
    /// (TRBE) data belongs to the CPU of its record (perf's `cs_etm__queue_aux_fragment`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_cpu: Option<i32>,
}

/// One line of `events.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Line {
    Aux {
        cpu: i32,
        offset: u64,
        size: u64,
        flags: u64,
        time: u64,
        #[serde(default)]
        aux_offset: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source_cpu: Option<i32>,
    },
    Sample(PauseSample),
}

/// A parsed `events.jsonl` line.
enum Parsed {
    Core(Line),
    Sideband(Sideband),
}

fn parse_line(text: &[u8]) -> Result<Parsed, serde_json::Error> {
    // The writer puts the tag first, so the common lines parse once; anything else tries both.
    if text.starts_with(b"{\"type\":\"aux\"") || text.starts_with(b"{\"type\":\"sample\"") {
        return serde_json::from_slice::<Line>(text).map(Parsed::Core);
    }
    match serde_json::from_slice::<Sideband>(text) {
        Ok(s) => Ok(Parsed::Sideband(s)),
        Err(e) => serde_json::from_slice::<Line>(text).map(Parsed::Core).map_err(|_| e),
    }
}

/// An event the pipeline consumes, borrowed from its source (the live rings or a session
/// reader): this is the `SessionEvent` both drivers feed to [`crate::Pipeline::push`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEvent<'a> {
    /// AUX bytes of one `PERF_RECORD_AUX` for a CPU.
    Aux {
        /// Record header.
        record: AuxRecord,
        /// The bytes (possibly fewer than the kernel announced if the source was truncated).
        data: &'a [u8],
    },
    /// A pause/sampling sample.
    Sample(&'a PauseSample),
    /// A sideband record.
    Sideband(&'a Sideband),
}

impl SessionEvent<'_> {
    /// The event's perf-clock time.
    pub fn time(&self) -> u64 {
        match self {
            SessionEvent::Aux { record, .. } => record.time,
            SessionEvent::Sample(s) => s.time,
            SessionEvent::Sideband(s) => s.time(),
        }
    }
}

/// Writes a session directory.
pub struct SessionWriter {
    dir: PathBuf,
    meta: SessionMeta,
    events: BufWriter<File>,
    aux: HashMap<i32, (BufWriter<File>, u64)>,
    /// `ustack.bin` (created with the first copy) and its length.
    ustack: Option<(BufWriter<File>, u64)>,
    line: Vec<u8>,
}

fn aux_file_name(cpu: i32) -> String {
    format!("cpu{cpu}.bin")
}

impl SessionWriter {
    /// Create `dir` (and `aux/`, `images/`) and start a session with `meta` (its `version` is
    /// set to [`FORMAT_VERSION`]). Existing session files in `dir` are overwritten.
    pub fn create(dir: &Path, mut meta: SessionMeta) -> Result<Self, SessionError> {
        meta.version = FORMAT_VERSION;
        fs::create_dir_all(dir.join(AUX_DIR)).map_err(io_err(dir))?;
        let path = dir.join(EVENTS_FILE);
        let events = BufWriter::new(File::create(&path).map_err(io_err(&path))?);
        Ok(SessionWriter { dir: dir.to_path_buf(), meta, events, aux: HashMap::new(), ustack: None, line: Vec::new() })
    }

    /// The session directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The metadata, to update before [`SessionWriter::finish`] writes it.
    pub fn meta_mut(&mut self) -> &mut SessionMeta {
        &mut self.meta
    }

    /// Append one AUX record's bytes for `record.cpu` (`record.size` is not stored: the line's
    /// size is the number of bytes written).
    pub fn write_aux(&mut self, record: &AuxRecord, data: &[u8]) -> Result<(), SessionError> {
        let (w, off) = match self.aux.entry(record.cpu) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let path = self.dir.join(AUX_DIR).join(aux_file_name(record.cpu));
                let f = File::create(&path).map_err(io_err(&path))?;
                v.insert((BufWriter::new(f), 0))
            }
        };
        w.write_all(data)
            .map_err(|source| SessionError::Io { path: PathBuf::from(AUX_DIR).join(aux_file_name(record.cpu)), source })?;
        let offset = *off;
        *off += data.len() as u64;
        let line = Line::Aux {
            cpu: record.cpu,
            offset,
            size: data.len() as u64,
            flags: record.flags,
            time: record.time,
            aux_offset: record.aux_offset,
            source_cpu: record.source_cpu,
        };
        self.write_line(&line)
    }

    /// Append a pause sample (its user-stack copy, if any, to `ustack.bin`).
    pub fn write_sample(&mut self, sample: &PauseSample) -> Result<(), SessionError> {
        let ustack = match &sample.user_stack {
            Some(u) => Some(self.write_ustack(u)?),
            None => None,
        };
        // Serialize through a borrowed view to avoid cloning the stack.
        self.line.clear();
        #[derive(Serialize)]
        struct Tagged<'a> {
            #[serde(rename = "type")]
            ty: &'static str,
            #[serde(flatten)]
            s: &'a PauseSample,
            #[serde(skip_serializing_if = "Option::is_none")]
            ustack: Option<UstackLine>,
        }
        serde_json::to_writer(&mut self.line, &Tagged { ty: "sample", s: sample, ustack })
            .expect("serializing to a Vec cannot fail");
        self.flush_line()
    }

    fn write_ustack(&mut self, u: &UserStack) -> Result<UstackLine, SessionError> {
        let (w, off) = match &mut self.ustack {
            Some(w) => w,
            None => {
                let path = self.dir.join(USTACK_FILE);
                let f = File::create(&path).map_err(io_err(&path))?;
                self.ustack.insert((BufWriter::new(f), 0))
            }
        };
        w.write_all(&u.bytes).map_err(|source| SessionError::Io { path: PathBuf::from(USTACK_FILE), source })?;
        let offset = *off;
        *off += u.bytes.len() as u64;
        Ok(UstackLine { flags: u.flags, pc: u.pc, sp: u.sp, fp: u.fp, lr: u.lr, size: u.size, offset, len: u.bytes.len() as u64 })
    }

    /// Append a sideband record.
    pub fn write_sideband(&mut self, sb: &Sideband) -> Result<(), SessionError> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, sb).expect("serializing to a Vec cannot fail");
        self.flush_line()
    }

    /// Append any [`SessionEvent`] (what a recording live driver does with each event).
    pub fn write_event(&mut self, ev: &SessionEvent<'_>) -> Result<(), SessionError> {
        match ev {
            SessionEvent::Aux { record, data } => self.write_aux(record, data),
            SessionEvent::Sample(s) => self.write_sample(s),
            SessionEvent::Sideband(s) => self.write_sideband(s),
        }
    }

    /// Reference a code image; with `copy`, copy the file into `images/` (name made unique)
    /// and record the copy. Returns the index in `meta.images`.
    pub fn add_image(&mut self, path: &Path, build_id: Option<String>, copy: bool) -> Result<usize, SessionError> {
        let mut image = CodeImage { path: path.to_string_lossy().into_owned(), build_id, copy: None };
        if copy {
            let name = path.file_name().ok_or_else(|| SessionError::ImageName(path.to_path_buf()))?;
            let dir = self.dir.join(IMAGES_DIR);
            fs::create_dir_all(&dir).map_err(io_err(&dir))?;
            let mut rel = PathBuf::from(IMAGES_DIR).join(name);
            let mut n = 1;
            while self.meta.images.iter().any(|i| i.copy.as_deref() == Some(&*rel.to_string_lossy())) {
                rel = PathBuf::from(IMAGES_DIR).join(format!("{}.{n}", name.to_string_lossy()));
                n += 1;
            }
            let dst = self.dir.join(&rel);
            fs::copy(path, &dst).map_err(io_err(path))?;
            image.copy = Some(rel.to_string_lossy().into_owned());
        }
        self.meta.images.push(image);
        Ok(self.meta.images.len() - 1)
    }

    fn write_line(&mut self, line: &Line) -> Result<(), SessionError> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, line).expect("serializing to a Vec cannot fail");
        self.flush_line()
    }

    fn flush_line(&mut self) -> Result<(), SessionError> {
        self.line.push(b'\n');
        self.events.write_all(&self.line).map_err(|source| SessionError::Io { path: PathBuf::from(EVENTS_FILE), source })
    }

    /// Flush all files and write `session.json`.
    pub fn finish(mut self) -> Result<SessionMeta, SessionError> {
        let ev = self.dir.join(EVENTS_FILE);
        self.events.flush().map_err(io_err(&ev))?;
        for (cpu, (w, _)) in self.aux.iter_mut() {
            w.flush().map_err(|source| SessionError::Io { path: self.dir.join(AUX_DIR).join(aux_file_name(*cpu)), source })?;
        }
        if let Some((w, _)) = self.ustack.as_mut() {
            w.flush().map_err(|source| SessionError::Io { path: self.dir.join(USTACK_FILE), source })?;
        }
        let path = self.dir.join(META_FILE);
        let tmp = self.dir.join(format!("{META_FILE}.tmp"));
        let text = serde_json::to_vec_pretty(&self.meta).expect("serializing to a Vec cannot fail");
        fs::write(&tmp, text).map_err(io_err(&tmp))?;
        fs::rename(&tmp, &path).map_err(io_err(&path))?;
        Ok(self.meta)
    }
}

/// Counters of what the reader had to skip or shorten.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReaderStats {
    /// `events.jsonl` lines read.
    pub lines: u64,
    /// Lines that were not valid events (skipped).
    pub bad_lines: u64,
    /// AUX records whose bytes were missing in `aux/cpuN.bin` (fewer bytes delivered).
    pub aux_short: u64,
    /// AUX records whose file could not be opened (delivered empty).
    pub aux_missing: u64,
    /// Samples whose user-stack copy was missing or short in `ustack.bin` (delivered with
    /// the bytes that exist, or without the copy).
    pub ustack_short: u64,
}

/// Reads a session directory, yielding [`SessionEvent`]s in recorded order.
pub struct SessionReader {
    dir: PathBuf,
    meta: SessionMeta,
    events: BufReader<File>,
    aux: HashMap<i32, Option<File>>,
    /// `ustack.bin`, opened at the first sample that has a copy (`None` inside: missing).
    ustack: Option<Option<File>>,
    line: Vec<u8>,
    buf: Vec<u8>,
    current: Option<Parsed>,
    stats: ReaderStats,
}

impl SessionReader {
    /// Open `dir`: read and check `session.json`, open `events.jsonl`.
    pub fn open(dir: &Path) -> Result<Self, SessionError> {
        let meta = read_meta(dir)?;
        let path = dir.join(EVENTS_FILE);
        let events = BufReader::new(File::open(&path).map_err(io_err(&path))?);
        Ok(SessionReader {
            dir: dir.to_path_buf(),
            meta,
            events,
            aux: HashMap::new(),
            ustack: None,
            line: Vec::new(),
            buf: Vec::new(),
            current: None,
            stats: ReaderStats::default(),
        })
    }

    /// The session metadata.
    pub fn meta(&self) -> &SessionMeta {
        &self.meta
    }

    /// The session directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reader counters.
    pub fn stats(&self) -> ReaderStats {
        self.stats
    }

    /// Local path of a code image: its copy in the session if there is one, else its
    /// original path.
    pub fn image_path(&self, image: &CodeImage) -> PathBuf {
        match &image.copy {
            Some(c) => self.dir.join(c),
            None => PathBuf::from(&image.path),
        }
    }

    /// The next event, `Ok(None)` at the end. Malformed lines are counted and skipped; an I/O
    /// error on `events.jsonl` itself is returned.
    pub fn next_event(&mut self) -> Result<Option<SessionEvent<'_>>, SessionError> {
        loop {
            self.line.clear();
            let n = self
                .events
                .read_until(b'\n', &mut self.line)
                .map_err(|source| SessionError::Io { path: self.dir.join(EVENTS_FILE), source })?;
            if n == 0 {
                return Ok(None);
            }
            let text = self.line.trim_ascii();
            if text.is_empty() {
                continue;
            }
            self.stats.lines += 1;
            match parse_line(text) {
                Ok(mut l) => {
                    if let Parsed::Core(Line::Sample(s)) = &mut l
                        && let Some(u) = ustack_of(text)
                    {
                        s.user_stack = self.load_ustack(&u);
                    }
                    self.current = Some(l);
                    break;
                }
                Err(e) => {
                    log::debug!("skipping malformed event line: {e}");
                    self.stats.bad_lines += 1;
                }
            }
        }
        if let Some(Parsed::Core(Line::Aux { cpu, offset, size, .. })) = self.current {
            self.load_aux(cpu, offset, size);
        }
        Ok(match self.current.as_ref() {
            Some(Parsed::Core(Line::Aux { cpu, flags, time, aux_offset, size, source_cpu, .. })) => Some(SessionEvent::Aux {
                record: AuxRecord {
                    cpu: *cpu,
                    flags: *flags,
                    time: *time,
                    aux_offset: *aux_offset,
                    size: *size,
                    source_cpu: *source_cpu,
                },
                data: &self.buf,
            }),
            Some(Parsed::Core(Line::Sample(s))) => Some(SessionEvent::Sample(s)),
            Some(Parsed::Sideband(s)) => Some(SessionEvent::Sideband(s)),
            None => None,
        })
    }

    fn load_aux(&mut self, cpu: i32, offset: u64, size: u64) {
        self.buf.clear();
        let dir = &self.dir;
        let file = self.aux.entry(cpu).or_insert_with(|| File::open(dir.join(AUX_DIR).join(aux_file_name(cpu))).ok());
        let Some(f) = file else {
            self.stats.aux_missing += 1;
            return;
        };
        if !read_range(f, offset, size, &mut self.buf) {
            self.stats.aux_short += 1;
        }
    }

    /// The copy an `ustack` field points to (`None`, counted, if `ustack.bin` is missing or
    /// holds none of it; the bytes that exist, counted, if it is short).
    fn load_ustack(&mut self, u: &UstackLine) -> Option<UserStack> {
        let dir = &self.dir;
        let file = self.ustack.get_or_insert_with(|| File::open(dir.join(USTACK_FILE)).ok());
        let mut bytes = Vec::new();
        let complete = file.as_mut().is_some_and(|f| read_range(f, u.offset, u.len, &mut bytes));
        if !complete {
            self.stats.ustack_short += 1;
        }
        (!bytes.is_empty() || complete).then_some(UserStack {
            flags: u.flags,
            pc: u.pc,
            sp: u.sp,
            fp: u.fp,
            lr: u.lr,
            size: u.size,
            bytes,
        })
    }
}

/// The `ustack` field of a sample line, if it has one.
fn ustack_of(text: &[u8]) -> Option<UstackLine> {
    const KEY: &[u8] = b"\"ustack\":";
    if !text.windows(KEY.len()).any(|w| w == KEY) {
        return None;
    }
    serde_json::from_slice::<UstackOnly>(text).ok().map(|u| u.ustack)
}

/// Reads `f[offset..offset + size]` into `buf` (cleared first), bounded by the file's real
/// length (a corrupt size must not allocate wildly); whether all of it was there.
fn read_range(f: &mut File, offset: u64, size: u64, buf: &mut Vec<u8>) -> bool {
    buf.clear();
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let avail = len.saturating_sub(offset).min(size);
    if avail == 0 || f.seek(SeekFrom::Start(offset)).is_err() {
        return avail == size;
    }
    buf.resize(avail as usize, 0);
    let mut got = 0;
    while got < buf.len() {
        match f.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    buf.truncate(got);
    got as u64 == size
}

/// Read and check `DIR/session.json`.
pub fn read_meta(dir: &Path) -> Result<SessionMeta, SessionError> {
    let path = dir.join(META_FILE);
    let text = fs::read(&path).map_err(io_err(&path))?;
    let meta: SessionMeta = serde_json::from_slice(&text).map_err(|source| SessionError::Meta { path: path.clone(), source })?;
    if meta.version > FORMAT_VERSION {
        return Err(SessionError::Version(meta.version));
    }
    Ok(meta)
}

/// Read a whole file of the session (e.g. a code image copy, ground truth) — a convenience for
/// drivers that keep I/O out of the libraries.
pub fn read_file(path: &Path) -> Result<Vec<u8>, SessionError> {
    fs::read(path).map_err(io_err(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("etm-session-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    fn meta() -> SessionMeta {
        SessionMeta {
            source: SessionSource::Synthetic,
            target: TargetInfo { pid: 42, command: vec!["prog".into(), "10".into()] },
            arch: Some(CodeArch::Aarch64),
            cpus: vec![CpuTraceConfig {
                cpu: 0,
                arch: TraceArch::Ete,
                trace_id: 0x10,
                trcconfigr: 0x1800,
                trcidr0: 0x2800_02e1,
                trcidr2: 0x8800_0088,
                trcdevarch: 0x4770_5a13,
                ts_source: 1,
                ..Default::default()
            }],
            clock: Some(ClockParams { time_zero: 5, time_mult: 1 << 31, time_shift: 31, ..Default::default() }),
            branch_depth: 32,
            window: WindowParams { mode: "synthetic".into(), unit: "instructions".into(), window: 1000, period: 100_000 },
            ..Default::default()
        }
    }

    /// Everything written (meta, interleaved AUX/sample/sideband events, images) reads back equal.
    #[test]
    fn round_trip() {
        let dir = tmpdir("rt");
        let img_src = dir.with_extension("img");
        fs::write(&img_src, b"\x7fELF fake").unwrap();
        let mut w = SessionWriter::create(&dir, meta()).unwrap();
        let sample = PauseSample {
            cpu: 1,
            pid: 42,
            tid: 43,
            time: 1000,
            stack: vec![u64::MAX - 3, 0x40_0000],
            branches: Some(vec![BranchPair { from: 1, to: 2 }]),
            branch_flags: vec![(6 << 20) | (1 << 24)],
            window_ns: Some(812),
            user_stack: None,
        };
        let sbs = vec![
            Sideband::Mmap2 {
                pid: 42,
                tid: 42,
                addr: 0x40_0000,
                len: 0x1000,
                pgoff: 0,
                prot: 5,
                flags: 2,
                filename: "/bin/prog".into(),
                build_id: Some("abcd".into()),
                time: 1,
                cpu: None,
            },
            Sideband::Comm { pid: 42, tid: 42, comm: "prog".into(), exec: true, time: 2, cpu: Some(0) },
            Sideband::Fork { pid: 42, ppid: 1, tid: 43, ptid: 42, time: 3, cpu: Some(0) },
            Sideband::Exit { pid: 42, ppid: 1, tid: 43, ptid: 42, time: 4, cpu: Some(1) },
            Sideband::Lost { id: 9, lost: 3, time: 5, cpu: Some(1) },
            Sideband::ItraceStart { pid: 42, tid: 42, time: 6, cpu: Some(0) },
            Sideband::AuxOutputHwId { hw_id: 0x0100_0000_0000_0110, time: 7, cpu: Some(0) },
            Sideband::Throttle { id: 3, unthrottle: false, time: 8, cpu: Some(1) },
            Sideband::Throttle { id: 3, unthrottle: true, time: 9, cpu: Some(1) },
            Sideband::Switch { out: true, pid: 42, tid: 43, next_prev: Some((0, 0)), time: 9, cpu: Some(1) },
            Sideband::WindowEnd { pid: 7, tid: 8, window_ns: Some(640), time: 9, cpu: 1 },
            Sideband::TraceComplete { cpu: None, time: 9 },
        ];
        let aux0 =
            AuxRecord { cpu: 0, flags: PERF_AUX_FLAG_CORESIGHT_FORMAT_RAW, time: 10, aux_offset: 0, size: 0, source_cpu: None };
        let aux1 =
            AuxRecord { cpu: -1, flags: PERF_AUX_FLAG_TRUNCATED, time: 11, aux_offset: 64, size: 100, source_cpu: Some(3) };
        let sized = |r: AuxRecord, n: u64| AuxRecord { size: n, ..r };
        for sb in &sbs {
            w.write_sideband(sb).unwrap();
        }
        w.write_aux(&aux0, &[1, 2, 3]).unwrap();
        w.write_aux(&aux1, &[9; 100]).unwrap();
        w.write_event(&SessionEvent::Aux { record: aux0, data: &[4, 5] }).unwrap();
        w.write_sample(&sample).unwrap();
        w.write_aux(&aux0, &[]).unwrap();
        w.add_image(&img_src, Some("abcd".into()), true).unwrap();
        w.add_image(&img_src, None, true).unwrap();
        w.add_image(Path::new("/lib/libc.so.6"), Some("ff".into()), false).unwrap();
        let written = w.finish().unwrap();

        let mut r = SessionReader::open(&dir).unwrap();
        assert_eq!(r.meta(), &written);
        assert_eq!(written.version, FORMAT_VERSION);
        for sb in &sbs {
            assert_eq!(r.next_event().unwrap(), Some(SessionEvent::Sideband(sb)));
        }
        assert_eq!(r.next_event().unwrap(), Some(SessionEvent::Aux { record: sized(aux0, 3), data: &[1, 2, 3] }));
        assert_eq!(r.next_event().unwrap(), Some(SessionEvent::Aux { record: aux1, data: &[9; 100] }));
        assert_eq!(r.next_event().unwrap(), Some(SessionEvent::Aux { record: sized(aux0, 2), data: &[4, 5] }));
        assert_eq!(r.next_event().unwrap(), Some(SessionEvent::Sample(&sample)));
        assert_eq!(r.next_event().unwrap(), Some(SessionEvent::Aux { record: sized(aux0, 0), data: &[] }));
        assert_eq!(r.next_event().unwrap(), None);
        assert_eq!(r.stats(), ReaderStats { lines: 17, ..Default::default() });
        let imgs = r.meta().images.clone();
        assert_eq!(fs::read(r.image_path(&imgs[0])).unwrap(), b"\x7fELF fake");
        assert_eq!(fs::read(r.image_path(&imgs[1])).unwrap(), b"\x7fELF fake");
        assert_ne!(imgs[0].copy, imgs[1].copy);
        assert_eq!(r.image_path(&imgs[2]), PathBuf::from("/lib/libc.so.6"));
        let _ = fs::remove_dir_all(&dir);
        let _ = fs::remove_file(&img_src);
    }

    /// A garbage line, invalid UTF-8 and an AUX record past the end of its file are counted, and
    /// the events around them still read.
    #[test]
    fn corrupt_files_are_counted_not_fatal() {
        let dir = tmpdir("corrupt");
        let mut w = SessionWriter::create(&dir, meta()).unwrap();
        let a = AuxRecord { cpu: 0, ..Default::default() };
        w.write_aux(&a, &[7; 10]).unwrap();
        w.write_aux(&a, &[8; 10]).unwrap();
        w.write_sideband(&Sideband::Lost { id: 0, lost: 1, time: 0, cpu: None }).unwrap();
        w.finish().unwrap();
        // Truncate the AUX file in the middle of the second record; corrupt the event file.
        let auxp = dir.join(AUX_DIR).join("cpu0.bin");
        fs::write(&auxp, [7u8; 15]).unwrap();
        let evp = dir.join(EVENTS_FILE);
        let mut text = fs::read(&evp).unwrap();
        let mut bad = b"{\"type\":\"nonsense\"}\n\xff\xfe garbage\n".to_vec();
        bad.extend_from_slice(&text);
        text = bad;
        fs::write(&evp, text).unwrap();
        let mut r = SessionReader::open(&dir).unwrap();
        match r.next_event().unwrap() {
            Some(SessionEvent::Aux { data, .. }) => assert_eq!(data, &[7; 10]),
            e => panic!("unexpected {e:?}"),
        }
        match r.next_event().unwrap() {
            Some(SessionEvent::Aux { data, record }) => assert_eq!((data, record.size), (&[7u8; 5][..], 10)),
            e => panic!("unexpected {e:?}"),
        }
        assert!(matches!(r.next_event().unwrap(), Some(SessionEvent::Sideband(Sideband::Lost { .. }))));
        assert_eq!(r.next_event().unwrap(), None);
        let s = r.stats();
        assert_eq!((s.bad_lines, s.aux_short), (2, 1));
        let _ = fs::remove_dir_all(&dir);
    }

    /// Pause samples with user-stack copies round-trip (bytes in `ustack.bin`, the line
    /// otherwise as before); a recording from before copies existed (a sample line without
    /// `ustack`, no `ustack.bin`) still reads, without a copy; a copy missing from a truncated
    /// `ustack.bin` is counted and delivered with what is there.
    #[test]
    fn user_stack_copies_round_trip_and_old_recordings_read() {
        let dir = tmpdir("ustack");
        let mut w = SessionWriter::create(&dir, meta()).unwrap();
        let copy =
            |n: usize, b: u8| UserStack { flags: 1, pc: 0x40_1000, sp: 0x7ff0_0000, fp: 9, lr: 0, size: 4096, bytes: vec![b; n] };
        let base = PauseSample { cpu: 0, pid: 42, tid: 42, time: 5, stack: vec![0x40_1000, 0x40_2000], ..Default::default() };
        let s1 = PauseSample { user_stack: Some(copy(4096, 0xaa)), ..base.clone() };
        let s2 = PauseSample { time: 6, ..base.clone() };
        let s3 = PauseSample { time: 7, user_stack: Some(copy(100, 0x55)), ..base.clone() };
        for s in [&s1, &s2, &s3] {
            w.write_sample(s).unwrap();
        }
        w.finish().unwrap();
        let text = fs::read_to_string(dir.join(EVENTS_FILE)).unwrap();
        assert_eq!(text.lines().filter(|l| l.contains("\"ustack\":")).count(), 2, "{text}");
        assert_eq!(fs::metadata(dir.join(USTACK_FILE)).unwrap().len(), 4196);
        let mut r = SessionReader::open(&dir).unwrap();
        for s in [&s1, &s2, &s3] {
            assert_eq!(r.next_event().unwrap(), Some(SessionEvent::Sample(s)));
        }
        assert_eq!(r.stats().ustack_short, 0);

        // Truncated ustack.bin: the first copy short, the last gone.
        let f = fs::OpenOptions::new().write(true).open(dir.join(USTACK_FILE)).unwrap();
        f.set_len(4000).unwrap();
        let mut r = SessionReader::open(&dir).unwrap();
        let Some(SessionEvent::Sample(got)) = r.next_event().unwrap() else { panic!() };
        assert_eq!(got.user_stack.as_ref().unwrap().bytes.len(), 4000);
        r.next_event().unwrap();
        let Some(SessionEvent::Sample(got)) = r.next_event().unwrap() else { panic!() };
        assert_eq!(got.user_stack, None);
        assert_eq!(r.stats().ustack_short, 2);

        // An older recording's sample line, as version 1 wrote it before copies.
        let old =
            "{\"type\":\"sample\",\"cpu\":0,\"pid\":42,\"tid\":42,\"time\":5,\"stack\":[4198400,4202496],\"branches\":null}\n";
        fs::write(dir.join(EVENTS_FILE), old).unwrap();
        fs::remove_file(dir.join(USTACK_FILE)).unwrap();
        let mut r = SessionReader::open(&dir).unwrap();
        assert_eq!(r.next_event().unwrap(), Some(SessionEvent::Sample(&base)));
        assert_eq!(r.stats(), ReaderStats { lines: 1, ..Default::default() });
        let _ = fs::remove_dir_all(&dir);
    }

    /// The clock conversion matches perf's formula on a hand-computed case (mult/2^shift = 0.5).
    #[test]
    fn clock_conversion() {
        let c = ClockParams { time_zero: 100, time_mult: 1 << 30, time_shift: 31, ..Default::default() };
        assert_eq!(c.to_perf_time(1000), 600);
        assert_eq!(c.to_perf_time(1001), 600);
        let short = ClockParams { time_cycles: 0x1_0000, time_mask: 0xffff, cap_user_time_short: true, ..c };
        // 0x1_0005 with a 16-bit mask relative to time_cycles stays 0x1_0005.
        assert_eq!(short.to_perf_time(0x0005), c.to_perf_time(0x1_0005));
    }
}
