//! The collection plan `run --branches etm` follows, and `doctor` shows: the window mode, the
//! periods sized against the kernel's limits, how the sinks publish and so how the collector
//! works, and what that costs and yields.
//!
//! **Interrupt limits.** Every overflow of the pause and resume events is a PMI. The kernel
//! throttles an event once it overflows `max_samples_per_tick = DIV_ROUND_UP(
//! perf_event_max_sample_rate, HZ)` times in a tick (`__perf_event_account_interrupt`), and
//! since `perf_event_throttle_group` it stops the whole group — for cs_etm a stop without
//! `PERF_EF_UPDATE` that leaves its AUX transaction open, so the CPU traces nothing more until
//! the group is opened anew. The plan keeps each event at or below half the sample rate (the
//! kernel also lowers the rate when handlers take long, `perf_sample_event_took`) and the
//! sum per CPU within an interrupt budget (`--irq-budget`, default
//! [`DEFAULT_IRQ_BUDGET`]), raising the pause period (so the mean window) or the resume
//! period where needed, and says so.
//!
//! **Free mode** ([`WindowMode::Free`]): pause every P cycles, resume every R > P cycles, R mod P
//! ≈ 0.618 P: a window opens at each resume and closes at the next pause, uniformly between
//! 0 and P cycles long (mean P/2); windows per second f/R, PMIs per second f/P + f/R, trace
//! duty P/2R. **Hardware stagger** ([`WindowMode::Hw`]): one pause per window (TRCEXTOUT1),
//! so 2 f/R PMIs. **Strobe**: the ETM strobes itself; one sampling PMI every R cycles.
//!
//! **Delivery** ([`Delivery`], `etm_live::collect`): per-CPU TRBEs publish at their watermark
//! and at stop; a sink shared by several traced CPUs only when the last of them stops
//! (harvests); a private ETR at every pause. Joining windows to samples without per-pause
//! records needs trace timestamps in the perf clock, i.e. `ts_source` 1 on every CPU (perf
//! converts only then, `cs_etm__convert_sample_time`); without them the plan traces one
//! thread per-thread, where a single event on the sink makes every pause publish its window.

use crate::attr::{EtmOptions, ModeChoice, WindowMode, WindowParams, free_running_periods};
use crate::discovery::CsEtmSystem;
use crate::host::HostFacts;
use crate::topology::{SinkTopology, cpu_list};

/// PMIs per second per CPU the plan allows for the pause and resume events together.
pub const DEFAULT_IRQ_BUDGET: u64 = 10_000;
/// CPU frequency assumed when sysfs does not give one (high: the rates are upper bounds).
pub const ASSUMED_HZ: u64 = 3_500_000_000;
/// Trace bytes per traced instruction assumed for sizing harvests (ETM trace of typical code
/// is a few bits per instruction; a high estimate harvests early).
pub const TRACE_BYTES_PER_INSN: f64 = 0.5;

/// How a topology's sinks publish trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Delivery {
    /// Every pause publishes its window (private ETR, per-thread session).
    PerPause,
    /// A per-CPU TRBE: at its watermark and at stop.
    Watermark,
    /// A sink shared by several CPUs: only when the last of them stops.
    Harvest,
}

impl Delivery {
    /// The name used in mode lines and recordings.
    pub fn name(self) -> &'static str {
        match self {
            Delivery::PerPause => "per-pause",
            Delivery::Watermark => "watermark",
            Delivery::Harvest => "harvest",
        }
    }

    /// Parses [`Delivery::name`].
    pub fn from_name(s: &str) -> Option<Self> {
        [Delivery::PerPause, Delivery::Watermark, Delivery::Harvest].into_iter().find(|d| d.name() == s)
    }
}

/// What the plan is made from.
#[derive(Debug, Clone, Copy)]
pub struct PlanInputs<'a> {
    pub sys: &'a CsEtmSystem,
    pub sinks: &'a SinkTopology,
    pub host: &'a HostFacts,
    /// CPUs to trace.
    pub cpus: &'a [u32],
    /// The window mode decision (`attr::choose_window_mode`).
    pub mode: &'a ModeChoice,
    /// Requested window (mean, cycles) and period (cycles between windows).
    pub params: WindowParams,
    /// The window and period were given by the user: raising them is a warning, not a note.
    pub params_explicit: bool,
    /// PMIs per second per CPU allowed.
    pub irq_budget: u64,
    /// Per-thread tracing requested.
    pub per_thread: bool,
    /// AUX ring bytes per buffer.
    pub aux_bytes: u64,
}

/// The plan (module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub mode: WindowMode,
    /// Pause event period (cycles); hw mode: TRCEXTOUT1 pulses per window.
    pub pause_period: u64,
    /// Resume event period (strobe: sampling period), cycles.
    pub resume_period: u64,
    /// Cycles per second used for the rates (sysfs, else [`ASSUMED_HZ`]).
    pub hz: u64,
    pub hz_assumed: bool,
    pub pause_interrupts_per_s: f64,
    pub resume_interrupts_per_s: f64,
    /// Trace windows per second per CPU (the most hybrid samples a CPU gives).
    pub windows_per_s: f64,
    /// Mean window (cycles).
    pub mean_window: f64,
    /// Share of cycles traced.
    pub duty: f64,
    pub delivery: Delivery,
    /// Harvest period (ms), if the collector harvests.
    pub harvest_ms: Option<u64>,
    /// One group following the target's thread instead of one per CPU.
    pub per_thread: bool,
    /// TRBE `aux_watermark` (bytes); 0: the kernel's default (half the buffer).
    pub aux_watermark: u32,
    /// Trace timestamps convert to the perf clock (every traced CPU's `ts_source` is 1).
    pub trace_timestamps: bool,
    /// Context IDs carry thread ids (`None`: unknown).
    pub context_ids: Option<bool>,
    /// Findings the user should see.
    pub warnings: Vec<String>,
    /// Adjustments of defaults (e.g. the default window raised to the interrupt budget).
    pub notes: Vec<String>,
}

impl Plan {
    /// Makes the plan.
    pub fn make(inp: &PlanInputs<'_>) -> Plan {
        let mut warnings = Vec::new();
        // Periods raised to the limits: warnings when the user chose them, notes for defaults.
        let mut raised = Vec::new();
        let (hz, hz_assumed) = match inp.host.cpu_max_hz {
            Some(h) if h > 0 => (h, false),
            _ => {
                warnings.push(format!("no cpufreq in sysfs: rates assume {:.1} GHz (upper bounds)", ASSUMED_HZ as f64 / 1e9));
                (ASSUMED_HZ, true)
            }
        };
        let f = hz as f64;
        let max_rate = inp.host.max_sample_rate.unwrap_or(100_000);
        let per_event = (max_rate / 2).max(1) as f64;
        let budget = inp.irq_budget.max(2) as f64;
        if max_rate < 100_000 {
            warnings.push(format!(
                "perf_event_max_sample_rate is {max_rate} (default 100000): periods are raised to stay below half of it"
            ));
        }
        let WindowParams { window, period, .. } = inp.params;
        let (pause_period, resume_period, pause_irqs, resume_irqs, windows_per_s, mean_window) = match inp.mode.mode {
            WindowMode::Free => {
                // The resume event gets at most half the budget; the pause event the rest.
                let r_min = (f / (budget / 2.0).min(per_event)).ceil() as u64;
                let mut r = period;
                if r < r_min {
                    raised.push(format!("resume period raised from {period} to {r_min} cycles (interrupt budget)"));
                    r = r_min;
                }
                let p_min = (f / (budget - f / r as f64).min(per_event)).ceil() as u64;
                let mut p = (window.max(2) * 2) | 1;
                if p < p_min {
                    let w = p_min.div_ceil(2);
                    raised.push(format!(
                        "mean window raised from {window} to {w} cycles: a pause every {} cycles would be {:.0} interrupts/s (budget {budget:.0}, limit {per_event:.0} per event)",
                        p,
                        f / p as f64
                    ));
                    p = (w * 2) | 1;
                }
                if r < p + p / 2 {
                    r = p + p / 2;
                }
                let (p, r) = free_running_periods(p / 2, r);
                (p, r, f / p as f64, f / r as f64, f / r as f64, p as f64 / 2.0)
            }
            WindowMode::Hw => {
                let r_min = (2.0 * f / budget).max(f / per_event).ceil() as u64;
                let r = period.max(r_min);
                if r > period {
                    raised.push(format!("resume period raised from {period} to {r} cycles (interrupt budget)"));
                }
                (window.max(1), r, f / r as f64, f / r as f64, f / r as f64, window as f64)
            }
            WindowMode::Strobe => {
                let r_min = (f / budget.min(per_event)).ceil() as u64;
                let r = period.max(r_min);
                if r > period {
                    raised.push(format!("sampling period raised from {period} to {r} cycles (interrupt budget)"));
                }
                let strobe_window = 5000.0;
                (0, r, 0.0, f / r as f64, f / r as f64, strobe_window)
            }
        };
        let duty = match inp.mode.mode {
            WindowMode::Strobe => 1.0 / inp.params.strobe_preset.max(1) as f64,
            _ => (mean_window * windows_per_s / f).min(1.0),
        };
        // Delivery, from the sinks of the traced CPUs.
        let traced: Vec<_> = inp.cpus.iter().filter_map(|c| inp.sinks.sink_of(*c).map(|s| (*c, s))).collect();
        for c in inp.cpus {
            if inp.sinks.sink_of(*c).is_none() {
                warnings.push(format!("cpu {c}: no sink reachable; it produces no trace"));
            }
        }
        let shared_traced = traced.iter().any(|(_, s)| s.cpus.iter().filter(|c| inp.cpus.contains(c)).count() > 1 && !s.per_cpu);
        let all_per_cpu = !traced.is_empty() && traced.iter().all(|(_, s)| s.per_cpu);
        let trace_timestamps =
            inp.cpus.iter().all(|c| inp.sys.cpu(*c).is_some_and(|e| e.ts_source == Some(crate::discovery::TsSource::Virtual)));
        let mut per_thread = inp.per_thread;
        let mut delivery = if per_thread {
            Delivery::PerPause
        } else if shared_traced {
            Delivery::Harvest
        } else if all_per_cpu {
            Delivery::Watermark
        } else {
            Delivery::PerPause
        };
        if !trace_timestamps && delivery != Delivery::PerPause {
            warnings.push(format!(
                "trace timestamps do not convert to the perf clock (ts_source is not 1 on every CPU: no FEAT_TRF, the SoC's timestamp generator); {} sinks give no per-pause records, so one thread is traced per-thread",
                delivery.name()
            ));
            per_thread = true;
            delivery = Delivery::PerPause;
        }
        let harvest_ms = match delivery {
            Delivery::PerPause => None,
            Delivery::Watermark => Some(500),
            Delivery::Harvest => {
                // Fill time of the shared buffer (the ETR buffer has the AUX size) by every CPU
                // that shares it; harvest at a quarter of it, at most every 100 ms.
                let sharing = traced.iter().map(|(_, s)| s.cpus.len()).max().unwrap_or(1) as f64;
                let bytes_per_s = duty * f * TRACE_BYTES_PER_INSN * sharing;
                let fill_ms = inp.aux_bytes as f64 / bytes_per_s.max(1.0) * 1000.0;
                Some(((fill_ms / 4.0) as u64).clamp(5, 100))
            }
        };
        let aux_watermark =
            if delivery == Delivery::Watermark { (inp.aux_bytes / 8).clamp(64 << 10, u32::MAX as u64) as u32 } else { 0 };
        let context_ids = inp.host.context_ids_usable();
        match (inp.host.pid_in_contextidr, inp.host.init_pid_ns) {
            (Some(false), _) => warnings.push(
                "CONFIG_PID_IN_CONTEXTIDR is off: CONTEXTIDR does not hold thread ids; windows are placed by context-switch records".into(),
            ),
            (_, Some(false)) => warnings.push(
                "not in the initial PID namespace: the kernel does not trace context IDs for this session (etm4_parse_event_config); windows are placed by context-switch records".into(),
            ),
            (None, _) => warnings.push("kernel config not readable: whether CONTEXTIDR holds thread ids is unknown".into()),
            _ => {}
        }
        if let Some(ps) = inp.host.page_size
            && ps > 4096
        {
            warnings.push(format!(
                "{} KiB pages: ring sizes are set in bytes ({} KiB AUX per buffer)",
                ps / 1024,
                inp.aux_bytes / 1024
            ));
        }
        let notes = if inp.params_explicit {
            warnings.extend(raised);
            Vec::new()
        } else {
            raised
        };
        Plan {
            mode: inp.mode.mode,
            pause_period,
            resume_period,
            hz,
            hz_assumed,
            pause_interrupts_per_s: pause_irqs,
            resume_interrupts_per_s: resume_irqs,
            windows_per_s,
            mean_window,
            duty,
            delivery,
            harvest_ms,
            per_thread,
            aux_watermark,
            trace_timestamps,
            context_ids,
            warnings,
            notes,
        }
    }

    /// The group options this plan needs: its TRBE watermark, and no context IDs where the
    /// kernel will not trace thread ids — without `CONFIG_PID_IN_CONTEXTIDR` CONTEXTIDR holds
    /// no tid, and from a nested PID namespace `etm4_parse_event_config` leaves
    /// TRCCONFIGR.CID clear although the attr asks for it. Not asking keeps the attr, the
    /// TRCCONFIGR the decoder is given (`trcconfigr_for`) and the hardware in agreement.
    pub fn group_options(&self, opts: &EtmOptions) -> EtmOptions {
        let mut o = opts.clone();
        o.aux_watermark = self.aux_watermark;
        if self.context_ids == Some(false) {
            o.context_id = false;
        }
        o
    }

    /// Interrupts per second per CPU.
    pub fn interrupts_per_s(&self) -> f64 {
        self.pause_interrupts_per_s + self.resume_interrupts_per_s
    }

    /// The one line `run` prints (after the mode reason).
    pub fn line(&self, sinks: &SinkTopology) -> String {
        let periods = match self.mode {
            WindowMode::Strobe => format!("sampling every {} cycles", self.resume_period),
            WindowMode::Hw => format!("window {} pulses, resume every {} cycles", self.pause_period, self.resume_period),
            WindowMode::Free => format!("pause every {} cycles, resume every {}", self.pause_period, self.resume_period),
        };
        let delivery = match (self.delivery, self.harvest_ms) {
            (Delivery::Harvest, Some(ms)) => format!("harvest every {ms} ms"),
            (Delivery::Watermark, Some(ms)) => format!("watermark {} KiB + harvest every {ms} ms", self.aux_watermark / 1024),
            (d, _) => d.name().to_string(),
        };
        format!(
            "{periods}; at {:.2} GHz{}: {:.0} interrupts/s per CPU, {:.0} windows/s, mean window {:.0} cycles (duty {:.2}%), up to {:.0} hybrid samples/s per CPU; sinks {}: {delivery}{}",
            self.hz as f64 / 1e9,
            if self.hz_assumed { " (assumed)" } else { "" },
            self.interrupts_per_s(),
            self.windows_per_s,
            self.mean_window,
            100.0 * self.duty,
            self.windows_per_s,
            sinks.summary(),
            if self.per_thread { ", per-thread" } else { "" }
        )
    }
}

/// CPU list text (re-exported for the callers' messages).
pub fn cpus_text(cpus: &[u32]) -> String {
    cpu_list(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::{ModeInputs, choose_window_mode};
    use crate::discovery::KernelVersion;
    use crate::discovery::tests::{fixture, fixture_copy};

    fn plan(root: &std::path::Path, params: WindowParams, per_thread: bool) -> (Plan, SinkTopology) {
        plan_with(root, params, per_thread, true)
    }

    fn plan_with(root: &std::path::Path, params: WindowParams, per_thread: bool, explicit: bool) -> (Plan, SinkTopology) {
        let sys = CsEtmSystem::discover(root).unwrap();
        let sinks = SinkTopology::discover(root, &sys);
        let host = HostFacts::read(&root.join("proc"), root);
        let cpus: Vec<u32> = sys.cpus.iter().map(|c| c.cpu).collect();
        let mode =
            choose_window_mode(None, &ModeInputs { sys: &sys, cpus: &cpus, kernel: host.kernel.unwrap(), pause_probe: None })
                .unwrap();
        let p = Plan::make(&PlanInputs {
            sys: &sys,
            sinks: &sinks,
            host: &host,
            cpus: &cpus,
            mode: &mode,
            params,
            irq_budget: DEFAULT_IRQ_BUDGET,
            per_thread,
            aux_bytes: 4 << 20,
            params_explicit: explicit,
        });
        (p, sinks)
    }

    /// N1 (shared ETR, no FEAT_TRF): free mode within the budget (the 1,000-cycle default
    /// window would be 1.5M interrupts/s at 3 GHz), and without convertible timestamps one
    /// thread per-thread with per-pause records.
    #[test]
    fn n1_plan() {
        let (p, _) = plan(&fixture("n1-etr"), WindowParams::default(), false);
        assert_eq!(p.mode, WindowMode::Free);
        assert!(p.interrupts_per_s() <= DEFAULT_IRQ_BUDGET as f64 * 1.001, "{p:?}");
        assert!(p.pause_interrupts_per_s <= 50_000.0);
        assert!(p.mean_window > 1000.0 && p.warnings.iter().any(|w| w.contains("mean window raised")), "{:?}", p.warnings);
        assert!(!p.trace_timestamps && p.per_thread && p.delivery == Delivery::PerPause, "{p:?}");
        assert!(p.warnings.iter().any(|w| w.contains("ts_source")));
        // R mod P near 0.618 P, R > P.
        assert!(p.resume_period > p.pause_period);
    }

    /// The default window raised to the budget is a note, not a warning; the periods are the
    /// same as for the same numbers given explicitly.
    #[test]
    fn defaults_raised_quietly() {
        let (quiet, _) = plan_with(&fixture("n1-etr"), WindowParams::default(), false, false);
        let (loud, _) = plan(&fixture("n1-etr"), WindowParams::default(), false);
        assert_eq!((quiet.pause_period, quiet.resume_period), (loud.pause_period, loud.resume_period));
        assert!(quiet.notes.iter().any(|n| n.contains("mean window raised")), "{:?}", quiet.notes);
        assert!(!quiet.warnings.iter().any(|w| w.contains("raised")), "{:?}", quiet.warnings);
        assert!(loud.notes.is_empty());
    }

    /// Started from a nested PID namespace the kernel traces no context IDs
    /// (`etm4_parse_event_config`: `task_is_in_init_pid_ns(current)`): the group then does not
    /// ask for them, so neither the attr config nor the decoder's TRCCONFIGR has CID. In the
    /// initial namespace both have it.
    #[test]
    fn nested_pid_namespace_drops_context_ids() {
        use crate::attr::build_group;
        let root = fixture_copy("v2-trbe", "plan-ns");
        let sys = CsEtmSystem::discover(&root).unwrap();
        // TRCCONFIGR from the attr's config words (trcconfigr_for): CID (bit 6) or VMID (7).
        let has_cid = |g: &crate::attr::GroupPlan| g.trcconfigr & 0xc0 != 0;
        let (p, _) = plan(&root, WindowParams::default(), false);
        let g = build_group(&sys, 0, p.mode, &WindowParams::default(), &p.group_options(&EtmOptions::default())).unwrap();
        assert!(has_cid(&g), "{:#x}", g.trcconfigr);
        std::fs::write(root.join("proc/self/status"), "NSpid:\t4242\t17\nCapEff:\t000001ffffffffff\n").unwrap();
        let (p, _) = plan(&root, WindowParams::default(), false);
        assert_eq!(p.context_ids, Some(false));
        let g = build_group(&sys, 0, p.mode, &WindowParams::default(), &p.group_options(&EtmOptions::default())).unwrap();
        assert!(!has_cid(&g), "{:#x}", g.trcconfigr);
        assert_eq!(p.group_options(&EtmOptions::default()).aux_watermark, p.aux_watermark);
        let _ = std::fs::remove_dir_all(root);
    }

    /// V2 (TRBE per CPU, FEAT_TRF): watermark delivery with a small watermark and harvests.
    #[test]
    fn v2_plan() {
        let (p, sinks) = plan(&fixture("v2-trbe"), WindowParams::default(), false);
        assert_eq!((p.delivery, p.per_thread, p.trace_timestamps), (Delivery::Watermark, false, true));
        assert_eq!(p.aux_watermark, 512 << 10);
        assert!(p.interrupts_per_s() <= DEFAULT_IRQ_BUDGET as f64 * 1.001);
        let line = p.line(&sinks);
        assert!(line.contains("trbe0 (TRBE, cpu 0)") && line.contains("interrupts/s"), "{line}");
    }

    /// A shared ETR with convertible timestamps: harvests, at most every 100 ms.
    #[test]
    fn shared_etr_with_trf_harvests() {
        let root = fixture_copy("n1-etr", "plan-trf");
        for c in 0..4 {
            std::fs::write(root.join(format!("devices/platform/ARMHC500_0{c}/etm{c}/ts_source")), "1\n").unwrap();
        }
        let (p, _) = plan(&root, WindowParams::default(), false);
        assert_eq!(p.delivery, Delivery::Harvest);
        assert!(p.harvest_ms.is_some_and(|h| (5..=100).contains(&h)), "{p:?}");
        let _ = std::fs::remove_dir_all(root);
    }

    /// A lowered perf_event_max_sample_rate lowers the allowed pause rate to half of it.
    #[test]
    fn lowered_sample_rate() {
        let root = fixture_copy("v2-trbe", "plan-rate");
        std::fs::write(root.join("proc/sys/kernel/perf_event_max_sample_rate"), "4000\n").unwrap();
        let (p, _) = plan(&root, WindowParams::default(), false);
        assert!(p.pause_interrupts_per_s <= 2000.0 + 1.0 && p.resume_interrupts_per_s <= 2000.0 + 1.0, "{p:?}");
        assert!(p.warnings.iter().any(|w| w.contains("4000")));
        let _ = std::fs::remove_dir_all(root);
    }

    /// 64 KiB pages are said (ring sizes stay in bytes).
    #[test]
    fn big_pages() {
        let root = fixture_copy("v2-trbe", "plan-64k");
        std::fs::write(root.join("proc/self/smaps"), "KernelPageSize:       64 kB\n").unwrap();
        let (p, _) = plan(&root, WindowParams::default(), false);
        assert!(p.warnings.iter().any(|w| w.starts_with("64 KiB pages")), "{:?}", p.warnings);
        assert_eq!(KernelVersion::new(7, 0, 0), HostFacts::read(&root.join("proc"), &root).kernel.unwrap());
        let _ = std::fs::remove_dir_all(root);
    }
}
