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
                Ok(ModeChoice { mode: WindowMode::Hw, reason: format!("window hw: {pause_why}, trcextout1 and pmu_pulse present") })
            } else if pause_ok {
                Ok(ModeChoice { mode: WindowMode::Free, reason: format!("window free: {pause_why}, but {hw_missing}") })
            } else if autofdo {
                Ok(ModeChoice { mode: WindowMode::Strobe, reason: format!("window strobe: {pause_why}; {strobe_why}") })
            } else {
                Err(format!("no usable window mode: {pause_why} {strobe_why}"))
            }
        }
        Some(WindowMode::Hw) if hw_ok => {
            Ok(ModeChoice { mode: WindowMode::Hw, reason: format!("window hw (requested): {pause_why}, trcextout1 and pmu_pulse present") })
        }
        Some(WindowMode::Hw) => Err(format!("--window hw unavailable: {}", if pause_ok { hw_missing.to_string() } else { pause_why })),
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
    let k = (period.max(p) / p).max(1);
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
    /// Ask the kernel for the user callchain in pause samples (used when no eBPF stack).
    pub kernel_callchain: bool,
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
            kernel_callchain: true,
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
    let mut trcconfigr = 0u32;
    let set = |words: &mut ConfigWords, name: &'static str, v: u64| -> Result<(), AttrError> {
        sys.field(name).ok_or(AttrError::MissingField(name))?.set(words, v)?;
        Ok(())
    };
    let cpus: Vec<&crate::discovery::EtmCpu> = if cpu >= 0 { sys.cpu(cpu as u32).into_iter().collect() } else { sys.cpus.iter().collect() };
    if let Some(n) = opts.timestamp_interval {
        match sys.timestamp_layout() {
            TimestampLayout::Bool => set(&mut words, "timestamp", 1)?,
            TimestampLayout::Interval => set(&mut words, "timestamp", u64::from(n.clamp(1, 15)))?,
            TimestampLayout::Absent => return Err(AttrError::MissingField("timestamp")),
        }
        trcconfigr |= 1 << 11;
    }
    if opts.context_id {
        let alias = sys.field("contextid").or_else(|| sys.field("contextid1"));
        if let Some(f) = alias {
            f.set(&mut words, 1)?;
            let is2 = sys.field("contextid2").is_some_and(|c2| c2.word == f.word && c2.mask() == f.mask());
            trcconfigr |= if is2 { (1 << 7) | (1 << 15) } else { 1 << 6 };
        }
    }
    if opts.retstack && !cpus.is_empty() && cpus.iter().all(|c| c.has_retstack()) && sys.field("retstack").is_some() {
        set(&mut words, "retstack", 1)?;
        trcconfigr |= 1 << 12;
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
    let excl = if opts.user_only { flag::EXCLUDE_KERNEL | flag::EXCLUDE_HV } else { 0 };
    let mut etm = PerfEventAttr::new(sys.pmu_type, words.config);
    etm.config1 = words.config1;
    etm.config2 = words.config2;
    etm.config3 = words.config3;
    etm.sample_type = RING_SAMPLE_TYPE;
    etm.flags = flag::DISABLED | flag::SAMPLE_ID_ALL | flag::MMAP2 | flag::COMM | flag::COMM_EXEC | flag::TASK | excl;
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
    let with_stack = |mut a: PerfEventAttr| {
        if opts.kernel_callchain {
            a.sample_type |= sample::CALLCHAIN;
            a.flags |= flag::EXCLUDE_CALLCHAIN_KERNEL;
            a.sample_max_stack = 127;
        }
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
            events.push((EventRole::Pause, with_stack(pause)));
        }
        WindowMode::Free => {
            let (p, r) = free_running_periods(wp.window, wp.period);
            let mut resume = cycles(r);
            resume.aux_action = aux_action::RESUME;
            let mut pause = cycles(p);
            pause.aux_action = aux_action::PAUSE;
            events.push((EventRole::Resume, resume));
            events.push((EventRole::Pause, with_stack(pause)));
        }
        WindowMode::Strobe => {
            events.push((EventRole::Pause, with_stack(cycles(wp.period))));
        }
    }
    Ok(GroupPlan { mode, events, trcconfigr, pause_in_group: mode != WindowMode::Strobe })
}
