//! Live CoreSight ETM/ETE collection (`--branches etm`): discovery, the per-CPU cs_etm event
//! group with AUX pause/resume, the data + AUX mmaps, and the drain loop feeding
//! [`etm_session::pipeline::Pipeline`] (and, with `--record DIR`, a session directory).
//!
//! Entry points for `cmd/run.rs`:
//! * [`EtmLive::open`] discovers cs_etm under `sysfs_root`, decides the window mode (one line
//!   in [`EtmLive::mode_line`]), opens one group per CPU (or one per thread), maps the rings,
//!   and hands each pause event fd to the caller's `attach_pause` hook (e.g.
//!   `|fd| bpf.attach_perf_fd(fd)`), which attaches the eBPF program with SET_BPF.
//! * [`EtmLive::pipeline_config`] gives the `PipelineConfig` (per-CPU trace configuration,
//!   clock) to build the `Pipeline` with.
//! * [`EtmLive::enable`], then [`EtmLive::poll`] in a loop; [`EtmLive::push_bpf_sample`] for
//!   each record of the eBPF ring (converted from CLOCK_MONOTONIC to the perf clock);
//!   [`EtmLive::finish`] at the end.
//!
//! Pause stacks: with the eBPF program attached its records are the pause samples (the
//! program returns 0, which suppresses the kernel's own sample). Without it, the pause event
//! asks the kernel for the user callchain (`PERF_SAMPLE_CALLCHAIN`, same frame-pointer unwinder
//! as `bpf_get_stack`) and those samples, already in the perf clock and in the same ring as the
//! AUX records, are the pause samples.
//!
//! Nothing here has run on Arm hardware; see docs/live-etm.md.

#[cfg(test)]
mod standin;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow, bail};
use etm_perf::attr::{
    EtmOptions, ModeChoice, ModeInputs, PerfEventAttr, WindowMode, WindowParams, aux_action, build_group, choose_window_mode,
    flag,
};
use etm_perf::discovery::{CsEtmSystem, EtmCpu, TraceArch, TsSource};
use etm_session::pipeline::PipelineConfig;
use etm_session::session::{
    ClockParams, CpuTraceConfig, SessionEvent, SessionMeta, SessionSource, SessionWriter, Sideband, TargetInfo,
};

use etm_live::clock;
use etm_live::collect::{Collector, Groups, Strategy};
use etm_live::group::{self, GroupSpec, LiveGroup};
use etm_live::ring::RingSource;
use etm_live::stream::{EventSink, StreamStats};
use etm_live::sys;
use etm_perf::host::HostFacts;
use etm_perf::plan::{Plan, PlanInputs};
use etm_perf::topology::SinkTopology;
use etm_session::pipeline::TRACE_TIMESTAMPS_NOTE;

use crate::live::bpf::{SampleBpf, WindowPrograms};

/// What to collect.
#[derive(Debug, Clone)]
pub struct EtmConfig {
    /// Normally `/sys`.
    pub sysfs_root: PathBuf,
    /// Normally `/proc`.
    pub proc_root: PathBuf,
    /// Target process. Per-CPU mode traces the CPUs system-wide (`pid = -1`, so every thread
    /// of the target, existing or new, is covered) and keeps only the target's pause samples
    /// and sideband; per-thread mode traces exactly this thread id. None: every process.
    pub pid: Option<i32>,
    /// CPUs to trace (None: every CPU with an ETM).
    pub cpus: Option<Vec<u32>>,
    /// One buffer following the thread (`cpu = -1`) instead of one group per CPU.
    pub per_thread: bool,
    /// Requested window mode (None: decide).
    pub window: Option<WindowMode>,
    pub params: WindowParams,
    /// `params` were given by the user (raising them to the limits is a warning).
    pub params_explicit: bool,
    pub opts: EtmOptions,
    /// Data ring bytes per buffer (rounded up to a power of two of pages).
    pub data_bytes: usize,
    /// AUX ring bytes per buffer (rounded up to a power of two of pages): in bytes, so a
    /// 64 KiB-page kernel does not get 16 times the memory of a 4 KiB-page one.
    pub aux_bytes: usize,
    /// Probe AUX pause support by opening cs_etm with aux_start_paused (else: kernel version).
    pub probe: bool,
    /// `--record DIR`.
    pub record: Option<PathBuf>,
    /// Copy the executable images into the recording.
    pub copy_images: bool,
    /// Branch records kept per sample.
    pub branch_depth: u32,
    /// Target command line (for the recording's metadata).
    pub command: Vec<String>,
    /// PMIs per second per CPU the pause and resume events may cost together.
    pub irq_budget: u64,
}

impl Default for EtmConfig {
    fn default() -> Self {
        EtmConfig {
            sysfs_root: PathBuf::from("/sys"),
            proc_root: PathBuf::from("/proc"),
            pid: None,
            cpus: None,
            per_thread: false,
            window: None,
            params: WindowParams::default(),
            params_explicit: false,
            opts: EtmOptions::default(),
            data_bytes: 256 << 10,
            aux_bytes: 4 << 20,
            probe: true,
            record: None,
            copy_images: true,
            branch_depth: 32,
            command: Vec::new(),
            irq_budget: etm_perf::plan::DEFAULT_IRQ_BUDGET,
        }
    }
}

/// The session metadata describing one ETM: what perf's AUXTRACE_INFO carries.
pub fn cpu_trace_config(c: &EtmCpu, trcconfigr: u32) -> CpuTraceConfig {
    CpuTraceConfig {
        cpu: c.cpu as i32,
        arch: match c.arch {
            TraceArch::Ete { .. } => etm_session::session::TraceArch::Ete,
            _ => etm_session::session::TraceArch::Etmv4,
        },
        // Legacy ID (0x10 + 2*cpu) unless sysfs shows the allocated one; AUX_OUTPUT_HW_ID
        // records override it during the run.
        trace_id: c.trctraceid.map_or(0x10 + 2 * c.cpu as u8, |t| (t & 0x7f) as u8),
        sink_id: None,
        trcconfigr,
        trcidr0: c.trcidr0,
        trcidr1: c.trcidr1,
        trcidr2: c.trcidr2,
        trcidr8: c.trcidr8,
        trcauthstatus: c.trcauthstatus,
        trcdevarch: c.trcdevarch.unwrap_or(0),
        ts_source: match c.ts_source {
            Some(TsSource::Virtual) => 1,
            Some(TsSource::GuestPhysical) => 2,
            Some(TsSource::Physical) => 3,
            Some(TsSource::Other(x)) => x,
            Some(TsSource::Unknown) | None => -1,
        },
    }
}

/// Writes what the live path consumed into a session directory.
pub struct Recorder {
    writer: SessionWriter,
    copy_images: bool,
    seen: HashSet<String>,
    pub errors: u64,
}

impl Recorder {
    pub fn create(dir: &Path, meta: SessionMeta, copy_images: bool) -> anyhow::Result<Recorder> {
        let writer = SessionWriter::create(dir, meta).with_context(|| format!("create session {}", dir.display()))?;
        Ok(Recorder { writer, copy_images, seen: HashSet::new(), errors: 0 })
    }

    /// Records one event; executable file mappings also register (and copy) their image, and
    /// `[vdso]` is saved from the target's memory (it has no file).
    pub fn event(&mut self, ev: &SessionEvent<'_>) {
        if let SessionEvent::Sideband(Sideband::Mmap2 { pid, addr, len, filename, prot, build_id, .. }) = ev
            && prot & libc::PROT_EXEC as u32 != 0
        {
            if filename.starts_with('/')
                && self.seen.insert(filename.clone())
                && let Err(e) = self.writer.add_image(Path::new(filename), build_id.clone(), self.copy_images)
            {
                log::warn!("recording image {filename}: {e}");
                self.errors += 1;
            }
            if filename == "[vdso]"
                && self.seen.insert(filename.clone())
                && let Err(e) = self.save_vdso(*pid, *addr, *len)
            {
                log::warn!("recording [vdso] of {pid}: {e:#}");
                self.errors += 1;
            }
        }
        if let Err(e) = self.writer.write_event(ev) {
            log::warn!("recording: {e}");
            self.errors += 1;
        }
    }

    fn save_vdso(&mut self, pid: u32, addr: u64, len: u64) -> anyhow::Result<()> {
        let (_, bytes) = crate::live::maps::load_image(pid, "[vdso]", addr, len).context("cannot read the vdso")?;
        let rel = Path::new(etm_session::session::IMAGES_DIR).join("vdso");
        let dst = self.writer.dir().join(&rel);
        std::fs::create_dir_all(dst.parent().expect("images dir")).with_context(|| format!("create {}", dst.display()))?;
        std::fs::write(&dst, bytes).with_context(|| format!("write {}", dst.display()))?;
        self.writer.meta_mut().images.push(etm_session::session::CodeImage {
            path: "[vdso]".into(),
            build_id: None,
            copy: Some(rel.to_string_lossy().into_owned()),
        });
        Ok(())
    }

    pub fn meta_mut(&mut self) -> &mut SessionMeta {
        self.writer.meta_mut()
    }

    pub fn finish(self) -> anyhow::Result<SessionMeta> {
        Ok(self.writer.finish()?)
    }
}

/// Copies the sysfs files discovery reads (cs_etm `type`, `format/`, `sinks/`, `events/`, each
/// `cpuN/{trcidr,mgmt,ts_source}` and the core PMUs' `type`, `cpus`, `format/`, `events/`) into
/// `dest` with the same layout, so `CsEtmSystem::discover(dest)` works on a recording.
/// Symlinks (`cpuN`) are copied as directories. Unreadable files are skipped.
pub fn save_sysfs(sysfs_root: &Path, dest: &Path) -> anyhow::Result<usize> {
    use etm_perf::discovery::{CS_ETM, EVENT_SOURCE};
    fn copy_file(src: &Path, dst: &Path, n: &mut usize) -> anyhow::Result<()> {
        if let Ok(data) = std::fs::read(src) {
            if let Some(parent) = dst.parent() {
                std::fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
            }
            std::fs::write(dst, data).with_context(|| format!("write {}", dst.display()))?;
            *n += 1;
        }
        Ok(())
    }
    fn copy_dir_files(src: &Path, dst: &Path, n: &mut usize) -> anyhow::Result<()> {
        let Ok(rd) = std::fs::read_dir(src) else { return Ok(()) };
        for e in rd.flatten() {
            if e.path().is_file() {
                copy_file(&e.path(), &dst.join(e.file_name()), n)?;
            }
        }
        Ok(())
    }
    let src = sysfs_root.join(EVENT_SOURCE);
    let dst = dest.join(EVENT_SOURCE);
    let mut n = 0;
    let etm = src.join(CS_ETM);
    copy_file(&etm.join("type"), &dst.join(CS_ETM).join("type"), &mut n)?;
    for d in ["format", "sinks", "events"] {
        copy_dir_files(&etm.join(d), &dst.join(CS_ETM).join(d), &mut n)?;
    }
    for e in std::fs::read_dir(&etm).with_context(|| format!("read {}", etm.display()))?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.strip_prefix("cpu").is_some_and(|x| x.parse::<u32>().is_ok()) {
            let (s, d) = (e.path(), dst.join(CS_ETM).join(&name));
            copy_dir_files(&s.join("trcidr"), &d.join("trcidr"), &mut n)?;
            for f in ["trcauthstatus", "trcdevarch", "trctraceid"] {
                copy_file(&s.join("mgmt").join(f), &d.join("mgmt").join(f), &mut n)?;
            }
            copy_file(&s.join("ts_source"), &d.join("ts_source"), &mut n)?;
        }
    }
    for e in std::fs::read_dir(&src).with_context(|| format!("read {}", src.display()))?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("armv8_") || name.starts_with("armv9_") {
            let (s, d) = (e.path(), dst.join(&name));
            copy_file(&s.join("type"), &d.join("type"), &mut n)?;
            copy_file(&s.join("cpus"), &d.join("cpus"), &mut n)?;
            copy_dir_files(&s.join("format"), &d.join("format"), &mut n)?;
            copy_dir_files(&s.join("events"), &d.join("events"), &mut n)?;
            copy_dir_files(&s.join("caps"), &d.join("caps"), &mut n)?;
        }
    }
    // The CoreSight graph the sink topology is read from: every device's output connections
    // as links to the devices' names (`etm_perf::topology`), the cpuN ETMs' too.
    let cs = sysfs_root.join(etm_perf::topology::CORESIGHT_DEVICES);
    let cs_dst = dest.join(etm_perf::topology::CORESIGHT_DEVICES);
    let name_of = |p: &Path| std::fs::canonicalize(p).ok().and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()));
    let link_outs = |dev: &Path, to: &Path, up: &str, n: &mut usize| -> anyhow::Result<()> {
        let Ok(rd) = std::fs::read_dir(dev.join("connections")) else { return Ok(()) };
        for c in rd.flatten() {
            let link = c.file_name().to_string_lossy().into_owned();
            if let (true, Some(target)) = (link.starts_with("out:"), name_of(&c.path())) {
                std::fs::create_dir_all(to.join("connections"))?;
                let _ = std::os::unix::fs::symlink(format!("{up}{target}"), to.join("connections").join(&link));
                *n += 1;
            }
        }
        Ok(())
    };
    if let Ok(rd) = std::fs::read_dir(&cs) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            std::fs::create_dir_all(cs_dst.join(&name))?;
            link_outs(&e.path(), &cs_dst.join(&name), "../../", &mut n)?;
        }
    }
    for e in std::fs::read_dir(&etm).with_context(|| format!("read {}", etm.display()))?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.strip_prefix("cpu").is_some_and(|x| x.parse::<u32>().is_ok()) {
            link_outs(&e.path(), &dst.join(CS_ETM).join(&name), "../../../../../coresight/devices/", &mut n)?;
        }
    }
    // CPU frequencies (the plan's interrupt rates).
    for c in 0..4096 {
        let d = format!("devices/system/cpu/cpu{c}");
        if !sysfs_root.join(&d).exists() {
            break;
        }
        let f = format!("{d}/cpufreq/cpuinfo_max_freq");
        copy_file(&sysfs_root.join(&f), &dest.join(&f), &mut n)?;
    }
    Ok(n)
}

/// Copies what `etm_perf::host::HostFacts` reads from `proc_root` into `dest` (the kernel
/// release and perf settings, this process's `NSpid`/`CapEff` and page size, the kernel
/// config line on `CONFIG_PID_IN_CONTEXTIDR` as `dest/../boot/config-<release>`), so `doctor`
/// can read a recording.
pub fn save_proc(proc_root: &Path, dest: &Path) -> anyhow::Result<()> {
    let k = proc_root.join("sys/kernel");
    for f in
        ["osrelease", "perf_event_max_sample_rate", "perf_cpu_time_max_percent", "perf_event_paranoid", "perf_event_mlock_kb"]
    {
        if let Ok(v) = std::fs::read(k.join(f)) {
            std::fs::create_dir_all(dest.join("sys/kernel"))?;
            std::fs::write(dest.join("sys/kernel").join(f), v)?;
        }
    }
    std::fs::create_dir_all(dest.join("self"))?;
    let keep = |file: &str, keys: &[&str]| -> String {
        std::fs::read_to_string(proc_root.join(file))
            .unwrap_or_default()
            .lines()
            .filter(|l| keys.iter().any(|k| l.starts_with(k)))
            .take(keys.len())
            .map(|l| format!("{l}\n"))
            .collect()
    };
    std::fs::write(dest.join("self/status"), keep("self/status", &["NSpid:", "CapEff:"]))?;
    std::fs::write(dest.join("self/smaps"), keep("self/smaps", &["KernelPageSize:"]))?;
    let host = HostFacts::read(proc_root, Path::new("/nonexistent"));
    if let (Some(rel), Some(on)) = (host.release, host.pid_in_contextidr) {
        let boot = dest.parent().unwrap_or(dest).join("boot");
        std::fs::create_dir_all(&boot)?;
        let line = if on { "CONFIG_PID_IN_CONTEXTIDR=y\n" } else { "# CONFIG_PID_IN_CONTEXTIDR is not set\n" };
        std::fs::write(boot.join(format!("config-{rel}")), line)?;
    }
    Ok(())
}

/// Feeds events to the pipeline and the recorder.
pub struct Consumer<'a, 'b> {
    pub pipeline: Option<&'a mut (dyn EventSink + 'b)>,
    pub recorder: Option<&'a mut Recorder>,
}

impl EventSink for Consumer<'_, '_> {
    fn event(&mut self, ev: SessionEvent<'_>) {
        if let Some(r) = self.recorder.as_deref_mut() {
            r.event(&ev);
        }
        if let Some(p) = self.pipeline.as_deref_mut() {
            p.event(ev);
        }
    }
}

/// Whether `--branches auto` should pick ETM: a `cs_etm` PMU exists under `sysfs_root`.
pub fn cs_etm_present(sysfs_root: &Path) -> bool {
    sysfs_root.join(etm_perf::discovery::EVENT_SOURCE).join(etm_perf::discovery::CS_ETM).join("type").exists()
}

/// Opens cs_etm with `aux_start_paused` on this thread to see whether the kernel and PMU
/// support AUX pause: Some(true) opened, Some(false) refused with EINVAL/EOPNOTSUPP, None for
/// other errors (permissions, busy).
pub fn probe_aux_pause(sys: &CsEtmSystem) -> Option<bool> {
    let mut a = PerfEventAttr::new(sys.pmu_type, 0);
    a.flags = flag::DISABLED | flag::EXCLUDE_KERNEL | flag::EXCLUDE_HV;
    a.aux_action = aux_action::START_PAUSED;
    match sys::open(&a, 0, -1, None) {
        Ok(_) => Some(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::EOPNOTSUPP)) => Some(false),
        Err(e) => {
            log::info!("AUX pause probe inconclusive: {e}");
            None
        }
    }
}

/// Everything `run` and `doctor` decide from the machine before opening anything.
pub struct EtmSetup {
    pub sys: CsEtmSystem,
    pub sinks: SinkTopology,
    pub host: HostFacts,
    pub cpus: Vec<u32>,
    pub choice: ModeChoice,
    pub plan: Plan,
}

impl EtmSetup {
    /// Discovers the system and decides the mode and the plan (`probe`: open cs_etm once with
    /// `aux_start_paused` to learn whether AUX pause works, else judge by the kernel version).
    pub fn decide(cfg: &EtmConfig, probe: bool) -> anyhow::Result<EtmSetup> {
        let sys = CsEtmSystem::discover(&cfg.sysfs_root).context("cs_etm discovery")?;
        let host = HostFacts::read(&cfg.proc_root, &cfg.sysfs_root);
        let kernel = host.kernel.ok_or_else(|| anyhow!("cannot read the kernel release under {}", cfg.proc_root.display()))?;
        let cpus: Vec<u32> = match &cfg.cpus {
            Some(c) => c.iter().copied().filter(|c| sys.cpu(*c).is_some()).collect(),
            None => sys.cpus.iter().map(|c| c.cpu).collect(),
        };
        if cpus.is_empty() {
            bail!("no CPU with an ETM/ETE among the requested CPUs");
        }
        let pause_probe = if probe { probe_aux_pause(&sys) } else { None };
        let choice = choose_window_mode(cfg.window, &ModeInputs { sys: &sys, cpus: &cpus, kernel, pause_probe })
            .map_err(|e| anyhow!(e))?;
        let sinks = SinkTopology::discover(&cfg.sysfs_root, &sys);
        let plan = Plan::make(&PlanInputs {
            sys: &sys,
            sinks: &sinks,
            host: &host,
            cpus: &cpus,
            mode: &choice,
            params: cfg.params,
            irq_budget: cfg.irq_budget,
            per_thread: cfg.per_thread,
            aux_bytes: cfg.aux_bytes as u64,
            params_explicit: cfg.params_explicit,
        });
        Ok(EtmSetup { sys, sinks, host, cpus, choice, plan })
    }

    /// The mode line: why this mode, and the plan.
    pub fn mode_line(&self) -> String {
        format!("{}; {}", self.choice.reason, self.plan.line(&self.sinks))
    }
}

/// The open groups, as the collector drives them ([`Groups`]).
pub struct LiveGroups {
    groups: Vec<LiveGroup>,
    /// How to open each group again (None: an output ring).
    specs: Vec<Option<GroupSpec>>,
    programs: WindowPrograms,
}

impl Groups for LiveGroups {
    type Ring = sys::PerfBuffer;
    fn count(&self) -> usize {
        self.groups.len()
    }
    fn ring(&mut self, i: usize) -> &mut sys::PerfBuffer {
        &mut self.groups[i].buf
    }
    fn disable(&mut self, i: usize) -> std::io::Result<()> {
        self.groups[i].disable()
    }
    fn enable(&mut self, i: usize) -> std::io::Result<()> {
        self.groups[i].enable()
    }
    fn reopen(&mut self, i: usize) -> std::io::Result<etm_live::stream::CpuStream> {
        let Some(spec) = self.specs[i].clone() else { return Err(std::io::Error::other("an output ring has no group")) };
        // Closing the old group frees its ring and the stuck AUX transaction.
        let (g, stream) = group::open(&spec, &mut self.programs).map_err(std::io::Error::other)?;
        self.groups[i] = g;
        Ok(stream)
    }
}

/// A running live ETM collection.
pub struct EtmLive {
    groups: LiveGroups,
    collector: Collector,
    setup: EtmSetup,
    cpus: Vec<CpuTraceConfig>,
    clock: Option<ClockParams>,
    recorder: Option<Recorder>,
    started: std::time::Instant,
}

impl EtmLive {
    /// Discovers, decides the mode and the plan, and opens one group per CPU (or the
    /// per-thread group and one output ring per CPU) in the kernel's order through
    /// `etm_live::group::open`, with the window programs attached; events stay disabled until
    /// [`EtmLive::enable`].
    pub fn open(cfg: &EtmConfig, bpf: &SampleBpf) -> anyhow::Result<EtmLive> {
        let setup = EtmSetup::decide(cfg, cfg.probe)?;
        for w in &setup.sys.warnings {
            log::warn!("cs_etm discovery: {w}");
        }
        for w in &setup.plan.warnings {
            log::warn!("{w}");
        }
        for n in &setup.plan.notes {
            log::info!("{n}");
        }
        log::info!("{}", setup.sys.summary());
        let pid = cfg.pid.unwrap_or(-1);
        let plan = &setup.plan;
        if plan.per_thread && pid < 0 {
            bail!("per-thread mode needs a target pid");
        }
        let opts = plan.group_options(&cfg.opts);
        let targets: Vec<i32> = if plan.per_thread { vec![-1] } else { setup.cpus.iter().map(|&c| c as i32).collect() };
        let mut programs = bpf.window_programs()?;
        let (mut groups, mut specs, mut streams) = (Vec::new(), Vec::new(), Vec::new());
        let mut trcconfigr = 0;
        for &cpu in &targets {
            let mut g = build_group(&setup.sys, cpu, plan.mode, &cfg.params, &opts).context("building the event group")?;
            g.set_periods(plan.pause_period, plan.resume_period);
            trcconfigr = g.trcconfigr;
            let spec = GroupSpec {
                cpu,
                // Per-thread: the target's main thread (tid = pid).
                pid: if plan.per_thread { pid } else { -1 },
                plan: g,
                data_bytes: cfg.data_bytes,
                aux_bytes: cfg.aux_bytes,
                bpf_output: !plan.per_thread,
            };
            let (g, stream) = group::open(&spec, &mut programs).context("opening the cs_etm event group")?;
            groups.push(g);
            specs.push(Some(spec));
            streams.push(stream);
        }
        if plan.per_thread {
            // The pause records: one bpf-output ring per CPU, after the AUX ring (drain order).
            for &c in &setup.cpus {
                let (g, stream) =
                    group::open_output(c as i32, cfg.data_bytes, &mut programs).context("opening a bpf-output ring")?;
                groups.push(g);
                specs.push(None);
                streams.push(stream);
            }
        }
        let target = cfg.pid.filter(|&p| p > 0).map(|p| p as u32);
        for s in &mut streams {
            s.target = target;
        }
        let strategy = Strategy { delivery: plan.delivery, harvest_every_ns: plan.harvest_ms.map(|m| m * 1_000_000) };
        let cpus = setup.cpus.iter().filter_map(|&c| setup.sys.cpu(c)).map(|c| cpu_trace_config(c, trcconfigr)).collect();
        let clock = groups.first().and_then(|g| clock::clock_params(&g.buf.page()));
        if clock.is_none() {
            log::warn!("no cap_user_time_zero: ETM timestamps cannot be converted to the perf clock");
        }
        let mut live = EtmLive {
            groups: LiveGroups { groups, specs, programs },
            collector: Collector::new(streams, strategy),
            cpus,
            clock,
            recorder: None,
            started: std::time::Instant::now(),
            setup,
        };
        if let Some(dir) = &cfg.record {
            let mut notes = std::collections::HashMap::new();
            notes.insert("kernel".to_string(), live.setup.host.release.clone().unwrap_or_default());
            notes.insert("window_choice".to_string(), live.mode_line());
            notes.insert("sysfs".to_string(), live.setup.sys.summary());
            notes.insert("delivery".to_string(), live.setup.plan.delivery.name().to_string());
            notes.insert(TRACE_TIMESTAMPS_NOTE.to_string(), live.setup.plan.trace_timestamps.to_string());
            let meta = SessionMeta {
                source: SessionSource::Live,
                target: TargetInfo { pid: i64::from(pid), command: cfg.command.clone() },
                cpus: live.cpus.clone(),
                clock: live.clock,
                branch_depth: cfg.branch_depth,
                window: etm_session::session::WindowParams {
                    mode: format!("{:?}", live.setup.plan.mode).to_lowercase(),
                    unit: "cycles".into(),
                    window: live.setup.plan.pause_period / 2,
                    period: live.setup.plan.resume_period,
                },
                notes,
                arch: Some(etm_session::session::CodeArch::Aarch64),
                ..Default::default()
            };
            live.recorder = Some(Recorder::create(dir, meta, cfg.copy_images)?);
            let n = save_sysfs(&cfg.sysfs_root, &dir.join("sysfs")).context("saving the cs_etm sysfs metadata")?;
            save_proc(&cfg.proc_root, &dir.join("proc")).context("saving the kernel's settings")?;
            log::info!("recorded {n} sysfs files under {}", dir.join("sysfs").display());
        }
        Ok(live)
    }

    /// How often to tick: `default`, or the harvest period if shorter (a shared ETR that
    /// fills in less than `default` is harvested as often as the plan says).
    pub fn drain_interval(&self, default: std::time::Duration) -> std::time::Duration {
        match self.setup.plan.harvest_ms {
            Some(ms) => default.min(std::time::Duration::from_millis(ms.max(1))),
            None => default,
        }
    }

    /// The one-line explanation of the window mode and the plan.
    pub fn mode_line(&self) -> String {
        self.setup.mode_line()
    }

    /// The `WINDOW_*` flags the window programs need for this plan: strobing has no resume
    /// event (every pause samples), and a per-thread group uses one window slot.
    pub fn window_flags(&self) -> u32 {
        let mut f = 0;
        if self.setup.plan.mode == WindowMode::Strobe {
            f |= etm_bpf_common::WINDOW_UNGATED;
        }
        if self.setup.plan.per_thread {
            f |= etm_bpf_common::WINDOW_PER_THREAD;
        }
        f
    }

    /// The pipeline configuration for this collection.
    pub fn pipeline_config(&self, depth: usize) -> PipelineConfig {
        let mut c = PipelineConfig { cpus: self.cpus.clone(), clock: self.clock, ..Default::default() };
        c.trace_timestamps = self.setup.plan.trace_timestamps;
        c.join.depth = depth;
        c
    }

    /// Enables the groups (with aux_start_paused the trace stays off until the first resume).
    pub fn enable(&mut self) -> anyhow::Result<()> {
        for i in 0..self.groups.count() {
            self.groups.enable(i).with_context(|| format!("enabling group {i}"))?;
        }
        self.started = std::time::Instant::now();
        Ok(())
    }

    /// One step of the collection: drain every buffer into `pipeline` (and the recording),
    /// prove what the delivery proves, harvest when due.
    pub fn tick(&mut self, pipeline: Option<&mut dyn EventSink>) {
        let now = self.started.elapsed().as_nanos() as u64;
        let mut consumer = Consumer { pipeline, recorder: self.recorder.as_mut() };
        self.collector.tick(&mut self.groups, now, &mut consumer);
    }

    /// Feeds an event the driver made (MMAP2 of mappings that existed before the events were
    /// opened) to the pipeline and the recording.
    pub fn push_event(&mut self, ev: SessionEvent<'_>, pipeline: Option<&mut dyn EventSink>) {
        Consumer { pipeline, recorder: self.recorder.as_mut() }.event(ev);
    }

    /// Adds a note to the recording's metadata (no-op without `--record`).
    pub fn note(&mut self, key: &str, value: String) {
        if let Some(r) = self.recorder.as_mut() {
            r.meta_mut().notes.insert(key.to_string(), value);
        }
    }

    /// Per-buffer counters.
    pub fn stats(&self) -> Vec<(i32, StreamStats)> {
        self.collector.streams().iter().map(|s| (s.cpu, s.stats)).collect()
    }

    /// The collection's counters as the manifest's `etm` section: the collector's and, per
    /// AUX buffer (one per CPU, or one per thread with cpu -1), its stream's (ring records,
    /// AUX records and gaps, pause records, windows of other processes, stacks failed or
    /// taken from the copy, sequence gaps, throttles, ...).
    pub fn counts(&self) -> serde_json::Value {
        counts_json(&self.collector.stats, self.collector.streams())
    }

    /// The collector's counters.
    pub fn collect_stats(&self) -> etm_live::collect::CollectStats {
        self.collector.stats
    }

    /// Disables the groups, drains what is left, and finishes the recording (trace IDs from
    /// AUX_OUTPUT_HW_ID records are written into its metadata).
    /// Returns the recording's metadata (if recording) and the final [`EtmLive::counts`].
    pub fn finish(self, pipeline: Option<&mut dyn EventSink>) -> anyhow::Result<(Option<SessionMeta>, serde_json::Value)> {
        let EtmLive { mut groups, collector, mut recorder, .. } = self;
        let (streams, collect) = collector.finish(&mut groups, &mut Consumer { pipeline, recorder: recorder.as_mut() });
        let counts = counts_json(&collect, &streams);
        let Some(mut rec) = recorder else { return Ok((None, counts)) };
        for s in &streams {
            if s.cpu < 0 {
                continue;
            }
            if let (Some(h), Some(c)) = (s.hw_ids.last(), rec.meta_mut().cpus.iter_mut().find(|c| c.cpu == s.cpu)) {
                c.trace_id = h.trace_id;
                c.sink_id = h.sink_id;
            }
        }
        if rec.errors > 0 {
            log::warn!("{} recording errors", rec.errors);
        }
        Ok((Some(rec.finish()?), counts))
    }
}

fn counts_json(collect: &etm_live::collect::CollectStats, streams: &[etm_live::stream::CpuStream]) -> serde_json::Value {
    serde_json::json!({
        "collection": collect,
        "buffers": streams.iter().map(|s| serde_json::json!({"cpu": s.cpu, "counts": s.stats})).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use etm_live::ring::MemRing as FakeRing;
    use etm_live::stream::{CpuStream, IdRole};
    use etm_perf::attr::RING_SAMPLE_TYPE;
    use etm_perf::records::{SampleFormat, SampleId, build, sample};
    use etm_session::session::{SessionEvent, SessionReader};

    /// The pause program's record of a window closed in the target with `stack`.
    fn pause_rec(fmt: &SampleFormat, sid: &SampleId, seq: u32, stack: &[u64]) -> Vec<u8> {
        let h = etm_bpf_common::PauseHeader {
            flags: etm_bpf_common::PAUSE_TARGET,
            pid: sid.pid.unwrap_or(0),
            tid: sid.tid.unwrap_or(0),
            window_ns: 500,
            seq,
            stack_len: stack.len() as u32,
        };
        etm_live::stream::pause_sample_record(fmt, sid, &h, stack)
    }

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("perf/tests/fixtures").join(name)
    }

    /// The session metadata of the N1 fixture: ETMv4, legacy trace IDs, the IDRs and
    /// TRCCONFIGR carried through, no FEAT_TRF (ts_source -1).
    #[test]
    fn trace_config_from_fixture() {
        let sys = CsEtmSystem::discover(&fixture("n1-etr")).unwrap();
        let c = cpu_trace_config(sys.cpu(3).unwrap(), 0x9880);
        assert_eq!(c.cpu, 3);
        assert_eq!(c.arch, etm_session::session::TraceArch::Etmv4);
        assert_eq!(c.trace_id, 0x16);
        assert_eq!(
            (c.trcidr0, c.trcidr1, c.trcidr2, c.trcconfigr, c.ts_source),
            (0x28000ea1, 0x4100f423, 0x20001088, 0x9880, -1)
        );
        let v2 = CsEtmSystem::discover(&fixture("v2-trbe")).unwrap();
        let c = cpu_trace_config(v2.cpu(1).unwrap(), 0);
        assert_eq!((c.arch, c.trace_id, c.trcdevarch), (etm_session::session::TraceArch::Ete, 0x12, 0x47715a13));
    }

    /// The live drain feeds the shared pipeline correctly: windows written into a fake AUX
    /// ring (toy trace format) with their PERF_RECORD_AUX, each followed by a pause sample with
    /// a kernel callchain, come out of the pipeline's join as hybrid samples carrying exactly
    /// that window's branches (newest first); a window whose AUX record is TRUNCATED is not
    /// joined, and the windows after it are. The same with the stream decoded on worker
    /// threads (`run --decode-threads`): the joins come out identical, in the same order.
    #[test]
    fn drain_feeds_pipeline_join() {
        for threads in [1, 2, 3] {
            drain_feeds_pipeline_join_with(threads);
        }
    }

    fn drain_feeds_pipeline_join_with(threads: usize) {
        use etm_session::decoder::toy::{ToyFactory, ToyWriter};
        use etm_session::session::BranchPair;
        use std::cell::RefCell;
        use std::rc::Rc;
        let fmt = SampleFormat { sample_type: RING_SAMPLE_TYPE, sample_id_all: true, branch_hw_index: false, regs_user_mask: 0 };
        let pfmt = SampleFormat { sample_type: RING_SAMPLE_TYPE | sample::RAW, ..fmt };
        let cpu = 2i32;
        let cfg = PipelineConfig {
            cpus: vec![CpuTraceConfig { cpu, trace_id: 0x14, ..Default::default() }],
            decoder: Some(std::sync::Arc::new(ToyFactory)),
            decode_threads: threads,
            ..Default::default()
        };
        let mut p = etm_session::Pipeline::new(cfg);
        type Joins = Rc<RefCell<Vec<(u64, Vec<BranchPair>)>>>;
        let got: Joins = Rc::default();
        let g = got.clone();
        p.set_observer(Box::new(move |j| g.borrow_mut().push((j.time, j.branches.to_vec()))));
        let mut ring = FakeRing::new(1024, 512);
        let mut s = CpuStream::new(cpu, fmt, &[(1, IdRole::Etm, fmt), (2, IdRole::BpfOutput, pfmt)], 512);
        let sid = |t: u64, id: u64| SampleId {
            pid: Some(1),
            tid: Some(1),
            time: Some(t),
            id: Some(id),
            stream_id: None,
            cpu: Some(cpu as u32),
        };
        let mut want = Vec::new();
        for k in 1..=8u64 {
            let base = 0x10_0000 + 0x1000 * k;
            let mut w = ToyWriter::default();
            w.sync().trace_on().ts(1000 * k);
            let mut brs = Vec::new();
            for i in 0..5u64 {
                let b = BranchPair { from: base + 0x10 * i + 8, to: base + 0x10 * (i + 1) };
                w.branch(b.from, b.to);
                brs.push(b);
            }
            brs.reverse();
            let off = ring.push_aux(&w.0);
            let flags = 0x100 | if k == 4 { 0x1 } else { 0 };
            ring.push_record(&build::aux(off, w.0.len() as u64, flags, &fmt, &sid(1000 * k + 400, 1)));
            let leaf = base + 0x54;
            ring.push_record(&pause_rec(&pfmt, &sid(1000 * k + 500, 2), k as u32, &[leaf, 0x1234]));
            if k != 4 {
                want.push((1000 * k + 500, brs));
            }
            let mut push = |ev: SessionEvent<'_>| p.push(ev);
            let mut c = Consumer { pipeline: Some(&mut push), recorder: None };
            s.drain(&mut ring, &mut c);
        }
        p.finish();
        assert_eq!(*got.borrow(), want, "{threads} decode threads");
        assert_eq!(ring.reenables, 1, "the TRUNCATED record must re-enable the event");
        assert_eq!(p.stats().aux_truncated, 1);
        assert_eq!(p.stats().decode_worker_failures, 0);
    }

    /// The saved sysfs and proc metadata of a recording rediscover to the same system, sink
    /// topology and host facts as the original tree (both fixtures, symlinked CPUs included).
    #[test]
    fn saved_sysfs_rediscovers() {
        for name in ["n1-etr", "v2-trbe"] {
            let dir = tempfile::tempdir().unwrap();
            let n = save_sysfs(&fixture(name), dir.path()).unwrap();
            assert!(n > 30, "{name}: {n} files");
            let a = CsEtmSystem::discover(&fixture(name)).unwrap();
            let b = CsEtmSystem::discover(dir.path()).unwrap();
            assert_eq!(SinkTopology::discover(&fixture(name), &a), SinkTopology::discover(dir.path(), &b), "{name}");
            let proc_copy = dir.path().join("proc");
            save_proc(&fixture(name).join("proc"), &proc_copy).unwrap();
            let (ha, hb) =
                (HostFacts::read(&fixture(name).join("proc"), &fixture(name)), HostFacts::read(&proc_copy, dir.path()));
            assert_eq!(ha, hb, "{name}");
            assert_eq!(
                (a.pmu_type, &a.formats, &a.sinks, &a.configs, &a.cpus, &a.pmus),
                (b.pmu_type, &b.formats, &b.sinks, &b.configs, &b.cpus, &b.pmus),
                "{name}"
            );
        }
    }

    /// `auto` detection sees cs_etm in the fixture trees and not in this VM's /sys.
    #[test]
    fn auto_detection() {
        assert!(cs_etm_present(&fixture("n1-etr")) && cs_etm_present(&fixture("v2-trbe")));
        assert!(!cs_etm_present(&fixture(".")));
    }

    /// On this machine there is no cs_etm: opening fails with a discovery error that says so.
    #[test]
    fn open_without_cs_etm_fails_cleanly() {
        let cfg = EtmConfig { sysfs_root: fixture("."), ..Default::default() };
        let e = EtmSetup::decide(&cfg, false).err().unwrap();
        assert!(format!("{e:#}").contains("no cs_etm"), "{e:#}");
    }

    /// The recorded session holds exactly what the stream consumed from a fake ring: the AUX
    /// bytes with their record boundaries, the pause sample, the sideband (and the image of an
    /// executable MMAP2), readable back with the replay engineer's SessionReader; the counts
    /// the manifest carries are the stream's.
    #[test]
    fn record_round_trip_through_session_reader() {
        let fmt = SampleFormat { sample_type: RING_SAMPLE_TYPE, sample_id_all: true, branch_hw_index: false, regs_user_mask: 0 };
        let pfmt = SampleFormat { sample_type: RING_SAMPLE_TYPE | sample::RAW, ..fmt };
        let sid =
            |t: u64, id: u64| SampleId { pid: Some(9), tid: Some(9), time: Some(t), id: Some(id), stream_id: None, cpu: Some(0) };
        let mut ring = FakeRing::new(4096, 512);
        let mut s = CpuStream::new(0, fmt, &[(1, IdRole::Etm, fmt), (2, IdRole::BpfOutput, pfmt)], 512);
        let exe = std::env::current_exe().unwrap();
        let mut mm = Vec::new();
        for v in [9u32, 9] {
            mm.extend_from_slice(&v.to_le_bytes());
        }
        for v in [0x40_0000u64, 0x1000, 0] {
            mm.extend_from_slice(&v.to_le_bytes());
        }
        mm.extend_from_slice(&[0; 24]);
        mm.extend_from_slice(&5u32.to_le_bytes()); // PROT_READ|PROT_EXEC
        mm.extend_from_slice(&2u32.to_le_bytes());
        mm.extend_from_slice(exe.to_string_lossy().as_bytes());
        mm.push(0);
        ring.push_record(&build::record(10, 0, &mm, &fmt, &sid(1, 1)));
        let w1: Vec<u8> = (0..100u8).collect();
        let w2: Vec<u8> = (0..60u8).map(|x| x ^ 0x5a).collect();
        for (k, w) in [&w1, &w2].into_iter().enumerate() {
            let off = ring.push_aux(w);
            ring.push_record(&build::aux(off, w.len() as u64, 0x100, &fmt, &sid(10 + k as u64, 1)));
        }
        ring.push_record(&pause_rec(&pfmt, &sid(20, 2), 1, &[0x400010, 0x400200]));
        let dir = tempfile::tempdir().unwrap();
        let meta = SessionMeta { branch_depth: 32, ..Default::default() };
        let mut rec = Recorder::create(dir.path(), meta, true).unwrap();
        s.drain(&mut ring, &mut Consumer { pipeline: None, recorder: Some(&mut rec) });
        let meta = rec.finish().unwrap();
        assert_eq!(meta.images.len(), 1);
        assert!(meta.images[0].copy.is_some());
        let mut r = SessionReader::open(dir.path()).unwrap();
        let mut auxes = Vec::new();
        let mut samples = Vec::new();
        let mut mmaps = 0;
        while let Some(ev) = r.next_event().unwrap() {
            match ev {
                SessionEvent::Aux { record, data } => auxes.push((record.time, record.flags, data.to_vec())),
                SessionEvent::Sample(p) => samples.push(p.clone()),
                SessionEvent::Sideband(Sideband::Mmap2 { .. }) => mmaps += 1,
                _ => {}
            }
        }
        assert_eq!(auxes, vec![(10, 0x100, w1), (11, 0x100, w2)]);
        assert_eq!(samples.len(), 1);
        assert_eq!((samples[0].time, samples[0].stack.clone()), (20, vec![0x400010, 0x400200]));
        assert_eq!(mmaps, 1);
        let img = r.image_path(&r.meta().images[0]);
        assert_eq!(std::fs::read(img).unwrap(), std::fs::read(&exe).unwrap());
        // The manifest's `etm` counts are the stream's: 2 AUX records of 160 bytes, a pause
        // record of the target.
        let c = counts_json(&etm_live::collect::CollectStats::default(), std::slice::from_ref(&s));
        let b = &c["buffers"][0];
        assert_eq!((b["cpu"].as_i64(), b["counts"]["aux"]["records"].as_u64()), (Some(0), Some(2)));
        assert_eq!((b["counts"]["aux"]["bytes"].as_u64(), b["counts"]["pause_records"].as_u64()), (Some(160), Some(1)));
        assert_eq!(c["collection"]["ticks"].as_u64(), Some(0));
    }
}

#[cfg(test)]
mod vdso_replay {
    use super::*;
    use etm_session::session::{PauseSample, SessionEvent};

    /// A frame in the target's `[vdso]` (no file: the recorder saves it from the target's
    /// memory) names the same in the replay of the recording as live, with the stack copy
    /// and the `--unwind` note a pause record of `run --record --unwind dwarf` carries; the
    /// replay's manifest has the live engine's unwind counts.
    #[test]
    fn vdso_frames_replay_as_live() {
        let pid = std::process::id();
        let mut sb = Vec::new();
        crate::live::maps::MapsTracker::new(pid).reload(1, &mut sb).unwrap();
        let vdso = sb
            .iter()
            .find_map(|s| match s {
                Sideband::Mmap2 { filename, addr, .. } if filename == "[vdso]" => Some(*addr),
                _ => None,
            })
            .expect("a vdso mapping");
        let mut sample = PauseSample { cpu: 0, pid, tid: pid, time: 5, stack: vec![vdso + 0x100], ..Default::default() };
        sample.user_stack = Some(etm_session::session::UserStack {
            flags: etm_bpf_common::USTACK_REGS,
            pc: vdso + 0x100,
            sp: 0x7fff_0000_0000,
            fp: 0,
            lr: 0,
            size: 4096,
            bytes: vec![0; 64],
        });
        let mode = crate::unwind::UnwindMode::Dwarf;
        let mut live = crate::engine::Engine::new(
            PipelineConfig { arch: etm_session::session::CodeArch::host(), ..Default::default() },
            Some(Box::new(crate::live::maps::load_image)),
        );
        live.enable_unwinding(mode);
        let dir = tempfile::tempdir().unwrap();
        let rec = dir.path().join("session");
        let mut notes = std::collections::HashMap::new();
        notes.insert(crate::cmd::run::UNWIND_NOTE.to_string(), crate::cmd::run::unwind_name(mode));
        let meta = SessionMeta {
            source: etm_session::session::SessionSource::Live,
            arch: etm_session::session::CodeArch::host(),
            window: etm_session::session::WindowParams { mode: "none".into(), ..Default::default() },
            notes,
            ..Default::default()
        };
        let mut recorder = Recorder::create(&rec, meta, false).unwrap();
        for x in &sb {
            recorder.event(&SessionEvent::Sideband(x));
            live.push(SessionEvent::Sideband(x));
        }
        recorder.event(&SessionEvent::Sample(&sample));
        live.push(SessionEvent::Sample(&sample));
        assert_eq!(recorder.errors, 0);
        recorder.finish().unwrap();
        let live_unwind = crate::engine::unwind_counts(&live);
        assert_eq!((live_unwind["enabled"].as_bool(), live_unwind["dwarf_stacks"].as_u64()), (Some(true), Some(1)));
        let (trie, frames) = live.pipeline().trie();
        let live: Vec<String> = etm_stacks::folded::folded_lines(trie, frames);
        assert_eq!(live, vec!["[vdso] 1".to_string()]);

        let out = dir.path().join("replayed");
        crate::cmd::replay::replay_headless(&rec, &out).unwrap();
        let replayed: Vec<String> =
            std::fs::read_to_string(out.join("profile.folded")).unwrap().lines().map(str::to_string).collect();
        assert_eq!(replayed, live);
        // The replay's manifest counts the unwinds as the live engine did.
        let manifest: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
        assert_eq!(manifest["unwind"], live_unwind);
    }
}
