//! `perf_event_attr` as a plain struct with the uapi byte layout, and the builders for the
//! cs_etm event group in the three window modes.
//!
//! Layout: `include/uapi/linux/perf_event.h` up to `config3` (PERF_ATTR_SIZE_VER8 = 136 bytes);
//! `aux_action` (the `aux_start_paused/aux_pause/aux_resume` bitfield union) is the u32 at
//! offset 116 (etm-interface.md §2). The bitfield word at offset 40 is assembled from the
//! [`flag`] constants (bit order of the uapi bitfield on little-endian targets).

use crate::discovery::{AuxPauseSupport, CsEtmSystem, KernelVersion, TimestampLayout};
use crate::format::{ConfigWords, FormatError};
use crate::records::{SampleFormat, sample};

/// `PERF_ATTR_SIZE_VER8`: everything up to and including `config3`.
pub const ATTR_SIZE_VER8: u32 = 136;

/// `PERF_TYPE_HARDWARE`.
pub const PERF_TYPE_HARDWARE: u32 = 0;
/// `PERF_TYPE_SOFTWARE`.
pub const PERF_TYPE_SOFTWARE: u32 = 1;
/// `PERF_COUNT_HW_CPU_CYCLES`.
pub const PERF_COUNT_HW_CPU_CYCLES: u64 = 0;

/// Bits of the attr flag word (byte offset 40).
pub mod flag {
    pub const DISABLED: u64 = 1 << 0;
    pub const INHERIT: u64 = 1 << 1;
    pub const PINNED: u64 = 1 << 2;
    pub const EXCLUSIVE: u64 = 1 << 3;
    pub const EXCLUDE_USER: u64 = 1 << 4;
    pub const EXCLUDE_KERNEL: u64 = 1 << 5;
    pub const EXCLUDE_HV: u64 = 1 << 6;
    pub const EXCLUDE_IDLE: u64 = 1 << 7;
    pub const MMAP: u64 = 1 << 8;
    pub const COMM: u64 = 1 << 9;
    pub const FREQ: u64 = 1 << 10;
    pub const INHERIT_STAT: u64 = 1 << 11;
    pub const ENABLE_ON_EXEC: u64 = 1 << 12;
    pub const TASK: u64 = 1 << 13;
    pub const WATERMARK: u64 = 1 << 14;
    pub const PRECISE_IP_SHIFT: u32 = 15;
    pub const MMAP_DATA: u64 = 1 << 17;
    pub const SAMPLE_ID_ALL: u64 = 1 << 18;
    pub const EXCLUDE_HOST: u64 = 1 << 19;
    pub const EXCLUDE_GUEST: u64 = 1 << 20;
    pub const EXCLUDE_CALLCHAIN_KERNEL: u64 = 1 << 21;
    pub const EXCLUDE_CALLCHAIN_USER: u64 = 1 << 22;
    pub const MMAP2: u64 = 1 << 23;
    pub const COMM_EXEC: u64 = 1 << 24;
    pub const USE_CLOCKID: u64 = 1 << 25;
    pub const CONTEXT_SWITCH: u64 = 1 << 26;
    pub const WRITE_BACKWARD: u64 = 1 << 27;
    pub const NAMESPACES: u64 = 1 << 28;
    pub const KSYMBOL: u64 = 1 << 29;
    pub const BPF_EVENT: u64 = 1 << 30;
    pub const AUX_OUTPUT: u64 = 1 << 31;
    pub const CGROUP: u64 = 1 << 32;
    pub const TEXT_POKE: u64 = 1 << 33;
    pub const BUILD_ID: u64 = 1 << 34;
}

/// Bits of `aux_action` (offset 116).
pub mod aux_action {
    pub const START_PAUSED: u32 = 1 << 0;
    pub const PAUSE: u32 = 1 << 1;
    pub const RESUME: u32 = 1 << 2;
}

/// `struct perf_event_attr` (through `config3`). Unions are represented by their first member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PerfEventAttr {
    pub ty: u32,
    pub size: u32,
    pub config: u64,
    /// `sample_period` (or `sample_freq` with [`flag::FREQ`]).
    pub sample_period: u64,
    pub sample_type: u64,
    pub read_format: u64,
    /// The bitfield word; see [`flag`].
    pub flags: u64,
    /// `wakeup_events` (or `wakeup_watermark` with [`flag::WATERMARK`]).
    pub wakeup_events: u32,
    pub bp_type: u32,
    pub config1: u64,
    pub config2: u64,
    pub branch_sample_type: u64,
    pub sample_regs_user: u64,
    pub sample_stack_user: u32,
    pub clockid: i32,
    pub sample_regs_intr: u64,
    pub aux_watermark: u32,
    pub sample_max_stack: u16,
    pub aux_sample_size: u32,
    /// See [`aux_action`].
    pub aux_action: u32,
    pub sig_data: u64,
    pub config3: u64,
}

/// Byte offsets of the fields (uapi layout).
pub mod offset {
    pub const TYPE: usize = 0;
    pub const SIZE: usize = 4;
    pub const CONFIG: usize = 8;
    pub const SAMPLE_PERIOD: usize = 16;
    pub const SAMPLE_TYPE: usize = 24;
    pub const READ_FORMAT: usize = 32;
    pub const FLAGS: usize = 40;
    pub const WAKEUP_EVENTS: usize = 48;
    pub const BP_TYPE: usize = 52;
    pub const CONFIG1: usize = 56;
    pub const CONFIG2: usize = 64;
    pub const BRANCH_SAMPLE_TYPE: usize = 72;
    pub const SAMPLE_REGS_USER: usize = 80;
    pub const SAMPLE_STACK_USER: usize = 88;
    pub const CLOCKID: usize = 92;
    pub const SAMPLE_REGS_INTR: usize = 96;
    pub const AUX_WATERMARK: usize = 104;
    pub const SAMPLE_MAX_STACK: usize = 108;
    pub const AUX_SAMPLE_SIZE: usize = 112;
    pub const AUX_ACTION: usize = 116;
    pub const SIG_DATA: usize = 120;
    pub const CONFIG3: usize = 128;
}

impl PerfEventAttr {
    /// A zeroed attr with `size` = [`ATTR_SIZE_VER8`].
    pub fn new(ty: u32, config: u64) -> Self {
        PerfEventAttr { ty, size: ATTR_SIZE_VER8, config, ..Default::default() }
    }

    /// Serialises to the uapi layout (native little-endian).
    pub fn to_bytes(&self) -> [u8; ATTR_SIZE_VER8 as usize] {
        use offset::*;
        let mut b = [0u8; ATTR_SIZE_VER8 as usize];
        let mut put = |off: usize, v: &[u8]| b[off..off + v.len()].copy_from_slice(v);
        put(TYPE, &self.ty.to_le_bytes());
        put(SIZE, &self.size.to_le_bytes());
        put(CONFIG, &self.config.to_le_bytes());
        put(SAMPLE_PERIOD, &self.sample_period.to_le_bytes());
        put(SAMPLE_TYPE, &self.sample_type.to_le_bytes());
        put(READ_FORMAT, &self.read_format.to_le_bytes());
        put(FLAGS, &self.flags.to_le_bytes());
        put(WAKEUP_EVENTS, &self.wakeup_events.to_le_bytes());
        put(BP_TYPE, &self.bp_type.to_le_bytes());
        put(CONFIG1, &self.config1.to_le_bytes());
        put(CONFIG2, &self.config2.to_le_bytes());
        put(BRANCH_SAMPLE_TYPE, &self.branch_sample_type.to_le_bytes());
        put(SAMPLE_REGS_USER, &self.sample_regs_user.to_le_bytes());
        put(SAMPLE_STACK_USER, &self.sample_stack_user.to_le_bytes());
        put(CLOCKID, &self.clockid.to_le_bytes());
        put(SAMPLE_REGS_INTR, &self.sample_regs_intr.to_le_bytes());
        put(AUX_WATERMARK, &self.aux_watermark.to_le_bytes());
        put(SAMPLE_MAX_STACK, &self.sample_max_stack.to_le_bytes());
        put(AUX_SAMPLE_SIZE, &self.aux_sample_size.to_le_bytes());
        put(AUX_ACTION, &self.aux_action.to_le_bytes());
        put(SIG_DATA, &self.sig_data.to_le_bytes());
        put(CONFIG3, &self.config3.to_le_bytes());
        b
    }

    /// Parses the uapi layout (shorter inputs leave the missing tail zero).
    pub fn from_bytes(bytes: &[u8]) -> Self {
        use crate::bytes::{u16_at, u32_at, u64_at};
        use offset::*;
        let u32f = |o| u32_at(bytes, o).unwrap_or(0);
        let u64f = |o| u64_at(bytes, o).unwrap_or(0);
        PerfEventAttr {
            ty: u32f(TYPE),
            size: u32f(SIZE),
            config: u64f(CONFIG),
            sample_period: u64f(SAMPLE_PERIOD),
            sample_type: u64f(SAMPLE_TYPE),
            read_format: u64f(READ_FORMAT),
            flags: u64f(FLAGS),
            wakeup_events: u32f(WAKEUP_EVENTS),
            bp_type: u32f(BP_TYPE),
            config1: u64f(CONFIG1),
            config2: u64f(CONFIG2),
            branch_sample_type: u64f(BRANCH_SAMPLE_TYPE),
            sample_regs_user: u64f(SAMPLE_REGS_USER),
            sample_stack_user: u32f(SAMPLE_STACK_USER),
            clockid: u32f(CLOCKID) as i32,
            sample_regs_intr: u64f(SAMPLE_REGS_INTR),
            aux_watermark: u32f(AUX_WATERMARK),
            sample_max_stack: u16_at(bytes, SAMPLE_MAX_STACK).unwrap_or(0),
            aux_sample_size: u32f(AUX_SAMPLE_SIZE),
            aux_action: u32f(AUX_ACTION),
            sig_data: u64f(SIG_DATA),
            config3: u64f(CONFIG3),
        }
    }

    /// The record layout this attr produces in its ring.
    pub fn sample_format(&self) -> SampleFormat {
        SampleFormat {
            sample_type: self.sample_type,
            sample_id_all: self.flags & flag::SAMPLE_ID_ALL != 0,
            branch_hw_index: self.branch_sample_type & (1 << 17) != 0,
            regs_user_mask: self.sample_regs_user,
        }
    }
}

/// How trace windows are opened and closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowMode {
    /// Hardware stagger: resume on cycles (period R), pause on the PMU's `trcextout1` event
    /// (counting the ETM's external output pulses) with a short period W.
    Hw,
    /// Free-running: pause and resume both on cycles, P ~ 2W and R with R mod P ~ 0.618 P, so
    /// that window lengths sweep (0, P) aperiodically.
    Free,
    /// No AUX pause: the `autofdo` strobing preset, with a separate sampling event for stacks.
    Strobe,
}

impl std::str::FromStr for WindowMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "hw" => Ok(WindowMode::Hw),
            "free" => Ok(WindowMode::Free),
            "strobe" => Ok(WindowMode::Strobe),
            _ => Err(format!("unknown window mode {s:?} (hw, free, strobe)")),
        }
    }
}

/// Inputs to the window mode decision.
#[derive(Debug, Clone, Copy)]
pub struct ModeInputs<'a> {
    pub sys: &'a CsEtmSystem,
    /// CPUs the target can run on.
    pub cpus: &'a [u32],
    pub kernel: KernelVersion,
    /// Result of a runtime probe (cs_etm opened with `aux_start_paused`), if one was made:
    /// overrides the version check.
    pub pause_probe: Option<bool>,
}

/// The decision and its one-line explanation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeChoice {
    pub mode: WindowMode,
    pub reason: String,
}

/// Chooses the window mode (`requested = None` for auto) and says why in one line. A
/// requested mode the system cannot do is an error carrying the reason.
pub fn choose_window_mode(requested: Option<WindowMode>, inp: &ModeInputs<'_>) -> Result<ModeChoice, String> {
    let ver = AuxPauseSupport::for_kernel(inp.kernel);
    let (pause_ok, pause_why) = match inp.pause_probe {
        Some(true) => (true, "cs_etm accepted aux_start_paused".to_string()),
        Some(false) => (false, format!("cs_etm refused aux_start_paused on kernel {}", inp.kernel)),
        None if ver.cs_etm => (true, format!("kernel {} >= 6.16 has CoreSight AUX pause", inp.kernel)),
        None if ver.attr_bits => {
            (false, format!("kernel {} has aux_action (6.13+) but CoreSight AUX pause needs 6.16", inp.kernel))
        }
        None => (false, format!("kernel {} predates AUX pause (6.13/6.16)", inp.kernel)),
    };
    let extout = inp.sys.trcextout1_on(inp.cpus);
    let pulse = inp.sys.field("pmu_pulse").is_some();
    let autofdo = inp.sys.configs.contains_key("autofdo");
    let hw_ok = pause_ok && extout && pulse;
    let hw_missing = if !extout {
        "the core PMU does not advertise trcextout1"
    } else if !pulse {
        "cs_etm has no pmu_pulse format field to drive TRCEXTOUT1"
    } else {
        "AUX pause is unavailable"
    };
    let strobe_why = if autofdo { "using the autofdo strobing preset" } else { "and cs_etm has no events/autofdo" };
    match requested {
        None => {
            if hw_ok {
                Ok(ModeChoice {
                    mode: WindowMode::Hw,
                    reason: format!("window hw: {pause_why}, trcextout1 and pmu_pulse present"),
                })
            } else if pause_ok {
                Ok(ModeChoice { mode: WindowMode::Free, reason: format!("window free: {pause_why}, but {hw_missing}") })
            } else if autofdo {
                Ok(ModeChoice { mode: WindowMode::Strobe, reason: format!("window strobe: {pause_why}; {strobe_why}") })
            } else {
                Err(format!("no usable window mode: {pause_why} {strobe_why}"))
            }
        }
        Some(WindowMode::Hw) if hw_ok => Ok(ModeChoice {
            mode: WindowMode::Hw,
            reason: format!("window hw (requested): {pause_why}, trcextout1 and pmu_pulse present"),
        }),
        Some(WindowMode::Hw) => {
            Err(format!("--window hw unavailable: {}", if pause_ok { hw_missing.to_string() } else { pause_why }))
        }
        Some(WindowMode::Free) if pause_ok => {
            Ok(ModeChoice { mode: WindowMode::Free, reason: format!("window free (requested): {pause_why}") })
        }
        Some(WindowMode::Free) => Err(format!("--window free unavailable: {pause_why}")),
        Some(WindowMode::Strobe) if autofdo => {
            Ok(ModeChoice { mode: WindowMode::Strobe, reason: "window strobe (requested): autofdo strobing preset".to_string() })
        }
        Some(WindowMode::Strobe) => Err("--window strobe unavailable: cs_etm has no events/autofdo".to_string()),
    }
}

/// Golden-ratio conjugate used for the free-running stagger.
pub const GOLDEN: f64 = 0.618_033_988_749_895;

/// Free-running periods: pause period `p` (odd, ~2 x window so windows average `window`) and
/// resume period `r` (~`period`) with `r mod p` = round(0.618 p) and gcd(r, p) = 1.
pub fn free_running_periods(window: u64, period: u64) -> (u64, u64) {
    let p = (window.max(2) * 2) | 1;
    let target = ((p as f64) * GOLDEN).round() as u64;
    let mut k = (period.max(p) / p).max(1);
    if k * p + target < period {
        k += 1;
    }
    let mut r = k * p + target;
    while gcd(r, p) != 1 {
        r += 1;
    }
    (p, r)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Window geometry in cycles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowParams {
    /// Window length W (hw: pause period on trcextout1; free: mean window).
    pub window: u64,
    /// Distance between window starts R (resume period; strobe: sampling period).
    pub period: u64,
    /// autofdo preset for strobe mode (1..=9; window 5000 cycles, period x window).
    pub strobe_preset: u8,
}

impl Default for WindowParams {
    fn default() -> Self {
        WindowParams { window: 1000, period: 1_000_003, strobe_preset: 9 }
    }
}

/// cs_etm options (each is applied only where the format field and the hardware allow).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtmOptions {
    /// Trace user space only (exclude_kernel, exclude_hv).
    pub user_only: bool,
    /// Timestamps; with the interval layout, the interval code to use (1 = every cycle
    /// counter reload of 1, the old boolean behaviour).
    pub timestamp_interval: Option<u8>,
    /// Context IDs (`contextid` alias: CONTEXTIDR_EL1 or EL2 as the kernel decides).
    pub context_id: bool,
    /// Return stack compression where every CPU has TRCIDR0.RETSTACK.
    pub retstack: bool,
    /// Sink name from `sinks/` (None = kernel default).
    pub sink: Option<String>,
    /// AUX wakeup watermark in bytes (0 = kernel default, half the buffer).
    pub aux_watermark: u32,
}

impl Default for EtmOptions {
    fn default() -> Self {
        EtmOptions {
            user_only: true,
            timestamp_interval: Some(1),
            context_id: true,
            retstack: true,
            sink: None,
            aux_watermark: 0,
        }
    }
}

/// Errors building the group.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttrError {
    /// A format field the chosen options need is not in `cs_etm/format/`.
    #[error("cs_etm has no format field {0:?}")]
    MissingField(&'static str),
    /// The requested sink is not in `cs_etm/sinks/`.
    #[error("no sink named {0:?}")]
    NoSink(String),
    /// `events/autofdo` missing for strobe mode.
    #[error("cs_etm has no events/autofdo configuration")]
    NoAutofdo,
    /// No core PMU for the CPU, or it lacks `trcextout1`.
    #[error("no core PMU event {what} for cpu {cpu}")]
    NoPmuEvent { what: &'static str, cpu: i32 },
    /// A value does not fit a field.
    #[error(transparent)]
    Format(#[from] FormatError),
}

/// Role of an event in a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventRole {
    /// The cs_etm AUX event (group leader, owns the data + AUX mmap).
    Etm,
    /// Opens windows (aux_resume).
    Resume,
    /// Closes windows and carries the eBPF program (aux_pause); in strobe mode, the plain
    /// sampling event carrying the eBPF program.
    Pause,
}

/// The attrs of one group (one CPU or one thread), leader first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupPlan {
    pub mode: WindowMode,
    pub events: Vec<(EventRole, PerfEventAttr)>,
    /// TRCCONFIGR as perf synthesises it from the attr options (`cs_etmv4_get_config`), for
    /// the decoder metadata.
    pub trcconfigr: u32,
    /// In strobe mode the sampling event is not grouped with cs_etm.
    pub pause_in_group: bool,
}

/// `PERF_COUNT_SW_DUMMY`: a software event that never overflows (a record-only leader).
pub const PERF_COUNT_SW_DUMMY: u64 = 9;
/// `PERF_COUNT_SW_CPU_CLOCK`: the hrtimer-driven cpu-clock.
pub const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
/// `PERF_COUNT_SW_BPF_OUTPUT`: the event `bpf_perf_event_output` writes to.
pub const PERF_COUNT_SW_BPF_OUTPUT: u64 = 10;

/// The per-CPU bpf-output event that carries the pause program's records: the kernel stamps
/// each with the ring's trailer (`perf_prepare_sample`: perf-clock TIME, TID, CPU) and the
/// record itself as PERF_SAMPLE_RAW. Same trailer bits as every other event of the ring.
pub fn bpf_output_attr() -> PerfEventAttr {
    let mut a = PerfEventAttr::new(PERF_TYPE_SOFTWARE, PERF_COUNT_SW_BPF_OUTPUT);
    a.sample_period = 1;
    a.sample_type = RING_SAMPLE_TYPE | sample::RAW;
    a.flags = flag::DISABLED | flag::SAMPLE_ID_ALL;
    a.wakeup_events = 1;
    a
}

/// What stands in for the cs_etm and PMU events where the kernel has none (this project's
/// real-kernel tests): the group keeps every other attr bit, so the open → mmap → SET_OUTPUT →
/// BPF attach → enable → drain sequence is the one a cs_etm group goes through.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StandIn {
    /// Leader: `dummy`; resume/pause: `cpu-clock` with each period in cycles scaled to ns
    /// (`perf_swevent_init_hrtimer` raises periods below 10 µs to 10 µs).
    Software { ns_per_cycle: f64 },
    /// Leader: `dummy`; resume/pause: the generic hardware cycles event (a guest with a PMU).
    HwCycles,
}

impl GroupPlan {
    /// Sets the pause and resume periods (the collection plan's, `plan::Plan`); strobe mode's
    /// sampler takes the resume period.
    pub fn set_periods(&mut self, pause: u64, resume: u64) {
        let mode = self.mode;
        for (role, a) in &mut self.events {
            match (role, mode) {
                (EventRole::Resume, _) => a.sample_period = resume.max(1),
                (EventRole::Pause, WindowMode::Strobe) => a.sample_period = resume.max(1),
                (EventRole::Pause, _) => a.sample_period = pause.max(1),
                (EventRole::Etm, _) => {}
            }
        }
    }

    /// The same group with stand-in events: no AUX (`aux_action` cleared, the kernel refuses
    /// it without an AUX leader) and no `pmu_pulse`/trcextout dependency.
    pub fn stand_in(&self, with: StandIn) -> GroupPlan {
        let mut g = self.clone();
        for (role, a) in &mut g.events {
            a.aux_action = 0;
            a.config1 = 0;
            a.config2 = 0;
            a.config3 = 0;
            match role {
                EventRole::Etm => {
                    a.ty = PERF_TYPE_SOFTWARE;
                    a.config = PERF_COUNT_SW_DUMMY;
                }
                EventRole::Resume | EventRole::Pause => match with {
                    StandIn::Software { ns_per_cycle } => {
                        a.ty = PERF_TYPE_SOFTWARE;
                        a.config = PERF_COUNT_SW_CPU_CLOCK;
                        a.sample_period = ((a.sample_period as f64 * ns_per_cycle).round() as u64).max(1);
                    }
                    StandIn::HwCycles => {
                        a.ty = PERF_TYPE_HARDWARE;
                        a.config = PERF_COUNT_HW_CPU_CYCLES;
                    }
                },
            }
        }
        g
    }
}

/// TRCCONFIGR as perf's `cs_etmv4_get_config` synthesises it from the cs_etm config words
/// (etm-interface.md §1.8): cycacc -> bit 4, contextid1 -> 6, contextid2 -> 7 and 15,
/// timestamp (any non-zero value) -> 11, retstack -> 12, branch_broadcast -> 3. Fields are
/// looked up in the system's `format/` (absent fields contribute nothing).
pub fn trcconfigr_for(sys: &CsEtmSystem, words: &ConfigWords) -> u32 {
    let on = |name: &str| sys.field(name).is_some_and(|f| f.get(words) != 0);
    let mut r = 0u32;
    if on("branch_broadcast") {
        r |= 1 << 3;
    }
    if on("cycacc") {
        r |= 1 << 4;
    }
    if on("contextid1") {
        r |= 1 << 6;
    }
    if on("contextid2") {
        r |= (1 << 7) | (1 << 15);
    }
    if on("timestamp") {
        r |= 1 << 11;
    }
    if on("retstack") {
        r |= 1 << 12;
    }
    r
}

/// `sample_type` of every event in the ring (the trailer bits must agree across events).
pub const RING_SAMPLE_TYPE: u64 = sample::IDENTIFIER | sample::IP | sample::TID | sample::TIME | sample::CPU | sample::PERIOD;

/// Builds the group for `cpu` (`-1` with a pid for per-thread mode).
pub fn build_group(
    sys: &CsEtmSystem,
    cpu: i32,
    mode: WindowMode,
    wp: &WindowParams,
    opts: &EtmOptions,
) -> Result<GroupPlan, AttrError> {
    let mut words = ConfigWords::default();
    let set = |words: &mut ConfigWords, name: &'static str, v: u64| -> Result<(), AttrError> {
        sys.field(name).ok_or(AttrError::MissingField(name))?.set(words, v)?;
        Ok(())
    };
    let cpus: Vec<&crate::discovery::EtmCpu> =
        if cpu >= 0 { sys.cpu(cpu as u32).into_iter().collect() } else { sys.cpus.iter().collect() };
    if let Some(n) = opts.timestamp_interval {
        match sys.timestamp_layout() {
            TimestampLayout::Bool => set(&mut words, "timestamp", 1)?,
            TimestampLayout::Interval => set(&mut words, "timestamp", u64::from(n.clamp(1, 15)))?,
            TimestampLayout::Absent => return Err(AttrError::MissingField("timestamp")),
        }
    }
    if opts.context_id {
        let alias = sys.field("contextid").or_else(|| sys.field("contextid1"));
        if let Some(f) = alias {
            f.set(&mut words, 1)?;
        }
    }
    if opts.retstack && !cpus.is_empty() && cpus.iter().all(|c| c.has_retstack()) && sys.field("retstack").is_some() {
        set(&mut words, "retstack", 1)?;
    }
    if let Some(s) = &opts.sink {
        let h = *sys.sinks.get(s).ok_or_else(|| AttrError::NoSink(s.clone()))?;
        set(&mut words, "sinkid", u64::from(h))?;
    }
    if mode == WindowMode::Strobe {
        let h = *sys.configs.get("autofdo").ok_or(AttrError::NoAutofdo)?;
        set(&mut words, "configid", h & 0xffff_ffff)?;
        set(&mut words, "preset", u64::from(wp.strobe_preset.clamp(1, 15)))?;
    }
    if mode == WindowMode::Hw {
        set(&mut words, "pmu_pulse", 1)?;
    }
    let trcconfigr = trcconfigr_for(sys, &words);
    let excl = if opts.user_only { flag::EXCLUDE_KERNEL | flag::EXCLUDE_HV } else { 0 };
    let mut etm = PerfEventAttr::new(sys.pmu_type, words.config);
    etm.config1 = words.config1;
    etm.config2 = words.config2;
    etm.config3 = words.config3;
    etm.sample_type = RING_SAMPLE_TYPE;
    // `mmap2` only changes the record format: exec mappings are reported because of `mmap`.
    // Context-switch records: perf sets `record_switch_events` for cs_etm too
    // (cs_etm_recording_options); a CPU-wide session traces every task, and the switches say
    // whose trace a stretch is where context IDs do not.
    etm.flags = flag::DISABLED
        | flag::SAMPLE_ID_ALL
        | flag::MMAP
        | flag::MMAP2
        | flag::COMM
        | flag::COMM_EXEC
        | flag::TASK
        | flag::CONTEXT_SWITCH
        | excl;
    etm.aux_watermark = opts.aux_watermark;
    if mode != WindowMode::Strobe {
        etm.aux_action = aux_action::START_PAUSED;
    }

    let pmu_cpu = if cpu >= 0 { cpu as u32 } else { sys.cpus.first().map_or(0, |c| c.cpu) };
    let pmu = sys.pmu_for_cpu(pmu_cpu);
    let cycles = |period: u64| -> PerfEventAttr {
        // The core PMU's own cpu_cycles event where known (heterogeneous systems), else the
        // generic hardware cycles event.
        let mut a = match pmu.and_then(|p| p.events.get("cpu_cycles").map(|&e| (p.pmu_type, e))) {
            Some((t, e)) => PerfEventAttr::new(t, e),
            None => PerfEventAttr::new(PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES),
        };
        a.sample_period = period;
        a.sample_type = RING_SAMPLE_TYPE;
        a.flags = flag::SAMPLE_ID_ALL | excl;
        a
    };
    let mut events = vec![(EventRole::Etm, etm)];
    match mode {
        WindowMode::Hw => {
            let p = pmu.ok_or(AttrError::NoPmuEvent { what: "core PMU", cpu })?;
            let ev = p.trcextout(1).ok_or(AttrError::NoPmuEvent { what: "trcextout1", cpu })?;
            let mut resume = cycles(wp.period);
            resume.aux_action = aux_action::RESUME;
            let mut pause = PerfEventAttr::new(p.pmu_type, ev);
            pause.sample_period = wp.window.max(1);
            pause.sample_type = RING_SAMPLE_TYPE;
            pause.flags = flag::SAMPLE_ID_ALL | excl;
            pause.aux_action = aux_action::PAUSE;
            events.push((EventRole::Resume, resume));
            events.push((EventRole::Pause, pause));
        }
        WindowMode::Free => {
            let (p, r) = free_running_periods(wp.window, wp.period);
            let mut resume = cycles(r);
            resume.aux_action = aux_action::RESUME;
            let mut pause = cycles(p);
            pause.aux_action = aux_action::PAUSE;
            events.push((EventRole::Resume, resume));
            events.push((EventRole::Pause, pause));
        }
        WindowMode::Strobe => {
            // Outside the group: opened disabled and enabled with it.
            let mut sampler = cycles(wp.period);
            sampler.flags |= flag::DISABLED;
            events.push((EventRole::Pause, sampler));
        }
    }
    Ok(GroupPlan { mode, events, trcconfigr, pause_in_group: mode != WindowMode::Strobe })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::tests::{fixture, fixture_copy};
    use std::path::Path;

    fn sys(name: &str) -> CsEtmSystem {
        CsEtmSystem::discover(&fixture(name)).unwrap()
    }

    /// Every field lands at the offset the uapi documents (etm-interface.md §2: aux_action at
    /// 116; config3 at 128 for PERF_ATTR_SIZE_VER8) and survives a round trip.
    #[test]
    fn byte_layout_documented_offsets() {
        let a = PerfEventAttr {
            ty: 0x11,
            size: 136,
            config: 0x22,
            sample_period: 0x33,
            sample_type: 0x44,
            read_format: 0x55,
            flags: 0x66,
            wakeup_events: 0x77,
            bp_type: 0x88,
            config1: 0x99,
            config2: 0xaa,
            branch_sample_type: 0xbb,
            sample_regs_user: 0xcc,
            sample_stack_user: 0xdd,
            clockid: -2,
            sample_regs_intr: 0xee,
            aux_watermark: 0xf1,
            sample_max_stack: 0xf2,
            aux_sample_size: 0xf3,
            aux_action: 0x5,
            sig_data: 0xf4,
            config3: 0xf5,
        };
        let b = a.to_bytes();
        assert_eq!(b.len(), 136);
        assert_eq!(b[116], 0x5);
        assert_eq!(b[128], 0xf5);
        assert_eq!(b[8], 0x22);
        assert_eq!(&b[92..96], &(-2i32).to_le_bytes());
        assert_eq!(PerfEventAttr::from_bytes(&b), a);
    }

    /// Field offsets and bitfield positions agree with the C compiler's view of the system's
    /// `<linux/perf_event.h>` (for every field that header has).
    #[test]
    fn layout_matches_system_header() {
        let header = Path::new("/usr/include/linux/perf_event.h");
        if !header.exists() {
            etm_testutil::skip(format!("{} not installed (linux-libc-dev)", header.display()));
            return;
        }
        let dir = std::env::temp_dir().join(format!("etm-perf-attr-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("a.c");
        let flags = [
            ("disabled", flag::DISABLED),
            ("inherit", flag::INHERIT),
            ("exclude_user", flag::EXCLUDE_USER),
            ("exclude_kernel", flag::EXCLUDE_KERNEL),
            ("exclude_hv", flag::EXCLUDE_HV),
            ("mmap", flag::MMAP),
            ("comm", flag::COMM),
            ("freq", flag::FREQ),
            ("task", flag::TASK),
            ("watermark", flag::WATERMARK),
            ("sample_id_all", flag::SAMPLE_ID_ALL),
            ("exclude_callchain_kernel", flag::EXCLUDE_CALLCHAIN_KERNEL),
            ("mmap2", flag::MMAP2),
            ("comm_exec", flag::COMM_EXEC),
            ("use_clockid", flag::USE_CLOCKID),
            ("context_switch", flag::CONTEXT_SWITCH),
            ("aux_output", flag::AUX_OUTPUT),
            ("build_id", flag::BUILD_ID),
        ];
        let offs = [
            ("config", offset::CONFIG),
            ("sample_period", offset::SAMPLE_PERIOD),
            ("sample_type", offset::SAMPLE_TYPE),
            ("wakeup_events", offset::WAKEUP_EVENTS),
            ("config1", offset::CONFIG1),
            ("config2", offset::CONFIG2),
            ("branch_sample_type", offset::BRANCH_SAMPLE_TYPE),
            ("sample_stack_user", offset::SAMPLE_STACK_USER),
            ("clockid", offset::CLOCKID),
            ("aux_watermark", offset::AUX_WATERMARK),
            ("sample_max_stack", offset::SAMPLE_MAX_STACK),
            ("aux_sample_size", offset::AUX_SAMPLE_SIZE),
            ("__reserved_3", offset::AUX_ACTION),
            ("sig_data", offset::SIG_DATA),
        ];
        let mut c = String::from(
            "#include <linux/perf_event.h>\n#include <stddef.h>\n#include <stdio.h>\n#include <string.h>\nint main(void){struct perf_event_attr a; unsigned long long w;\n",
        );
        for (n, _) in offs {
            c += &format!("printf(\"{n} %zu\\n\", offsetof(struct perf_event_attr, {n}));\n");
        }
        for (n, _) in flags {
            c += &format!("memset(&a,0,sizeof a); a.{n}=1; memcpy(&w,(char*)&a+40,8); printf(\"{n} %llu\\n\", w);\n");
        }
        c += "return 0;}\n";
        std::fs::write(&src, c).unwrap();
        let exe = dir.join("a");
        match std::process::Command::new("cc").arg(&src).arg("-o").arg(&exe).status() {
            Ok(s) if s.success() => {}
            other => {
                etm_testutil::skip(format!("cannot compile the layout probe with cc: {other:?}"));
                return;
            }
        }
        let out = String::from_utf8(std::process::Command::new(&exe).output().unwrap().stdout).unwrap();
        let got: std::collections::HashMap<&str, u64> =
            out.lines().filter_map(|l| l.split_once(' ')).map(|(k, v)| (k, v.parse().unwrap())).collect();
        for (n, o) in offs {
            assert_eq!(got[n], o as u64, "offset of {n}");
        }
        for (n, f) in flags {
            assert_eq!(got[n], f, "bit of {n}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    /// N1 free-running group: leader start-paused with timestamp bit 28, contextid2 bit 15 and
    /// retstack bit 29 (documented positions), then resume and pause cycles events; TRCCONFIGR
    /// carries TS(11), VMID+VMIDOPT(7,15) and RS(12) as perf's cs_etmv4_get_config would.
    #[test]
    fn n1_free_group() {
        let s = sys("n1-etr");
        let wp = WindowParams { window: 1000, period: 1_000_000, strobe_preset: 9 };
        let g = build_group(&s, 2, WindowMode::Free, &wp, &EtmOptions { sink: Some("tmc_etr0".into()), ..Default::default() })
            .unwrap();
        let roles: Vec<EventRole> = g.events.iter().map(|e| e.0).collect();
        assert_eq!(roles, vec![EventRole::Etm, EventRole::Resume, EventRole::Pause]);
        let etm = g.events[0].1;
        assert_eq!(etm.ty, 11);
        assert_eq!(etm.config, (1 << 28) | (1 << 15) | (1 << 29));
        assert_eq!(etm.config2, 0xa4c5_f0b2);
        assert_eq!(etm.aux_action, aux_action::START_PAUSED);
        assert!(etm.flags & flag::DISABLED != 0 && etm.flags & flag::SAMPLE_ID_ALL != 0 && etm.flags & flag::EXCLUDE_KERNEL != 0);
        // MMAP2 records need both bits (mmap2 alone produces none; checked on a real kernel in
        // the live driver's tests).
        assert_eq!(etm.flags & (flag::MMAP | flag::MMAP2), flag::MMAP | flag::MMAP2);
        assert_eq!(g.trcconfigr, (1 << 11) | (1 << 7) | (1 << 15) | (1 << 12));
        let (resume, pause) = (g.events[1].1, g.events[2].1);
        assert_eq!((resume.ty, resume.config, resume.aux_action), (10, 0x11, aux_action::RESUME));
        assert_eq!((pause.ty, pause.config, pause.aux_action), (10, 0x11, aux_action::PAUSE));
        assert_eq!((pause.sample_period, resume.sample_period), free_running_periods(1000, 1_000_000));
        // No PERF_SAMPLE_CALLCHAIN: the eBPF program reads the stack, and with CALLCHAIN the
        // kernel would unwind at every pause (perf_prepare_sample before the program runs) and
        // bpf_get_stack would copy that callchain, marker first (bpf_get_stack_pe).
        assert_eq!(pause.sample_type & sample::CALLCHAIN, 0);
        // All events agree on the trailer bits (one ring).
        let t = |a: &PerfEventAttr| a.sample_format().trailer_len();
        assert!(g.events.iter().all(|(_, a)| t(a) == t(&etm)));
        assert!(matches!(
            build_group(&s, 2, WindowMode::Free, &wp, &EtmOptions { sink: Some("nope".into()), ..Default::default() }),
            Err(AttrError::NoSink(_))
        ));
    }

    /// Free-running periods: P odd near 2W, R >= the requested period, R mod P within one of
    /// 0.618 P, and gcd(R, P) = 1 so every phase is visited.
    #[test]
    fn free_running_period_properties() {
        for (w, per) in [(1000u64, 1_000_000u64), (500, 10_000), (4000, 1_000_003), (1, 1)] {
            let (p, r) = free_running_periods(w, per);
            assert!(p % 2 == 1 && p >= 2 * w.max(2) && p <= 2 * w.max(2) + 1);
            assert!(r >= per.max(p));
            let ratio = (r % p) as f64 / p as f64;
            assert!((ratio - GOLDEN).abs() * p as f64 <= p as f64 * 0.01 + 1.0, "{w} {per}: {ratio}");
            assert_eq!(super::gcd(r, p), 1);
        }
    }

    /// V2 (interval layout): timestamp goes to config:4-7 as the interval code, not bit 28;
    /// contextid resolves to contextid1 (TRCCONFIGR bit 6).
    #[test]
    fn v2_interval_timestamps() {
        let s = sys("v2-trbe");
        let g = build_group(
            &s,
            0,
            WindowMode::Free,
            &WindowParams::default(),
            &EtmOptions { timestamp_interval: Some(3), ..Default::default() },
        )
        .unwrap();
        let etm = g.events[0].1;
        assert_eq!(etm.config & 0xf0, 3 << 4);
        assert_eq!(etm.config & (1 << 28), 0);
        assert_eq!(etm.config & (1 << 14), 1 << 14);
        assert_eq!(g.trcconfigr, (1 << 11) | (1 << 6) | (1 << 12));
    }

    /// Hardware stagger on V2 with a pmu_pulse field: pause counts trcextout1 (0x4011) on the
    /// core PMU with the short window period; the leader sets pmu_pulse.
    #[test]
    fn v2_hw_group() {
        let root = fixture_copy("v2-trbe", "hw");
        std::fs::write(root.join("bus/event_source/devices/cs_etm/format/pmu_pulse"), "config:9\n").unwrap();
        let s = CsEtmSystem::discover(&root).unwrap();
        let wp = WindowParams { window: 1000, period: 1_050_031, strobe_preset: 1 };
        let g = build_group(&s, 1, WindowMode::Hw, &wp, &EtmOptions::default()).unwrap();
        let (etm, resume, pause) = (g.events[0].1, g.events[1].1, g.events[2].1);
        assert_eq!(etm.config & (1 << 9), 1 << 9);
        assert_eq!((pause.ty, pause.config, pause.sample_period, pause.aux_action), (10, 0x4011, 1000, aux_action::PAUSE));
        assert_eq!((resume.config, resume.sample_period, resume.aux_action), (0x11, 1_050_031, aux_action::RESUME));
        let _ = std::fs::remove_dir_all(root);
    }

    /// Strobe: configid (autofdo hash) in config2[63:32], preset in config[3:0], no aux_action,
    /// and the sampling event outside the group.
    #[test]
    fn strobe_group() {
        let s = sys("n1-etr");
        let wp = WindowParams { strobe_preset: 4, ..Default::default() };
        let g = build_group(&s, 0, WindowMode::Strobe, &wp, &EtmOptions::default()).unwrap();
        let etm = g.events[0].1;
        assert_eq!(etm.config2 >> 32, 0xf4d0_e9a1);
        assert_eq!(etm.config & 0xf, 4);
        assert_eq!(etm.aux_action, 0);
        assert!(!g.pause_in_group);
        assert_eq!(g.events.len(), 2);
        assert_eq!(g.events[1].1.aux_action, 0);
    }

    /// The mode decision over the fixtures and kernel versions, with its stated reason.
    #[test]
    fn window_mode_decisions() {
        let n1 = sys("n1-etr");
        let v2 = sys("v2-trbe");
        let cpus = [0, 1, 2, 3];
        let k = |s: &str| KernelVersion::parse(s).unwrap();
        let pick = |s: &CsEtmSystem, kv: &str, probe, req| {
            choose_window_mode(req, &ModeInputs { sys: s, cpus: &cpus, kernel: k(kv), pause_probe: probe })
        };
        let c = pick(&n1, "6.16.0", None, None).unwrap();
        assert_eq!(c.mode, WindowMode::Free);
        assert!(c.reason.contains("trcextout1"), "{}", c.reason);
        let c = pick(&n1, "6.12.0", None, None).unwrap();
        assert_eq!(c.mode, WindowMode::Strobe);
        assert!(c.reason.contains("6.12.0"), "{}", c.reason);
        assert_eq!(pick(&n1, "6.14.0", None, None).unwrap().mode, WindowMode::Strobe);
        // A probe overrides the version guess both ways.
        assert_eq!(pick(&n1, "6.14.0", Some(true), None).unwrap().mode, WindowMode::Free);
        assert_eq!(pick(&n1, "6.18.0", Some(false), None).unwrap().mode, WindowMode::Strobe);
        // V2 has trcextout1 but no pmu_pulse: free, and it says what is missing.
        let c = pick(&v2, "7.0.0", None, None).unwrap();
        assert_eq!(c.mode, WindowMode::Free);
        assert!(c.reason.contains("pmu_pulse"), "{}", c.reason);
        assert!(pick(&n1, "6.16.0", None, Some(WindowMode::Hw)).unwrap_err().contains("trcextout1"));
        assert!(pick(&n1, "6.10.0", None, Some(WindowMode::Free)).is_err());
        assert_eq!(pick(&n1, "6.10.0", None, Some(WindowMode::Strobe)).unwrap().mode, WindowMode::Strobe);
        let root = fixture_copy("v2-trbe", "mode");
        std::fs::write(root.join("bus/event_source/devices/cs_etm/format/pmu_pulse"), "config:9\n").unwrap();
        let v2p = CsEtmSystem::discover(&root).unwrap();
        assert_eq!(pick(&v2p, "7.0.0", None, None).unwrap().mode, WindowMode::Hw);
        assert_eq!(pick(&v2p, "6.12.0", None, None).unwrap().mode, WindowMode::Strobe);
        std::fs::remove_file(root.join("bus/event_source/devices/cs_etm/events/autofdo")).unwrap();
        let v2q = CsEtmSystem::discover(&root).unwrap();
        assert!(pick(&v2q, "6.12.0", None, None).is_err());
        let _ = std::fs::remove_dir_all(root);
    }
}
