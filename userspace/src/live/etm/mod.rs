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
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow, bail};
use etm_perf::attr::{
    EtmOptions, ModeChoice, ModeInputs, PerfEventAttr, WindowMode, WindowParams, aux_action, build_group, choose_window_mode,
    flag,
};
use etm_perf::discovery::{CsEtmSystem, EtmCpu, KernelVersion, TraceArch, TsSource};
use etm_session::pipeline::PipelineConfig;
use etm_session::session::{
    ClockParams, CpuTraceConfig, SessionEvent, SessionMeta, SessionSource, SessionWriter, Sideband, TargetInfo,
};

use etm_live::clock;
use etm_live::group::{self, BpfHooks, GroupSpec, LiveGroup};
use etm_live::ring::RingSource;
use etm_live::stream::{EventSink, StreamStats};
use etm_live::sys;

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
            opts: EtmOptions::default(),
            data_bytes: 256 << 10,
            aux_bytes: 4 << 20,
            probe: true,
            record: None,
            copy_images: true,
            branch_depth: 32,
            command: Vec::new(),
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
        }
    }
    Ok(n)
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

/// A running live ETM collection.
pub struct EtmLive {
    groups: Vec<LiveGroup>,
    choice: ModeChoice,
    cpus: Vec<CpuTraceConfig>,
    clock: Option<ClockParams>,
    recorder: Option<Recorder>,
}

impl EtmLive {
    /// Discovers, decides the mode, and opens one group per CPU (or the per-thread group) in
    /// the kernel's order through `etm_live::group::open`, with `bpf` attaching the window
    /// programs; events stay disabled until [`EtmLive::enable`].
    pub fn open(cfg: &EtmConfig, bpf: &mut dyn BpfHooks) -> anyhow::Result<EtmLive> {
        let sys = CsEtmSystem::discover(&cfg.sysfs_root).context("cs_etm discovery")?;
        for w in &sys.warnings {
            log::warn!("cs_etm discovery: {w}");
        }
        log::info!("{}", sys.summary());
        let kernel = KernelVersion::read(&cfg.proc_root).context("kernel version")?;
        let cpus: Vec<u32> = match &cfg.cpus {
            Some(c) => c.iter().copied().filter(|c| sys.cpu(*c).is_some()).collect(),
            None => sys.cpus.iter().map(|c| c.cpu).collect(),
        };
        if cpus.is_empty() {
            bail!("no CPU with an ETM/ETE among the requested CPUs");
        }
        let probe = if cfg.probe { probe_aux_pause(&sys) } else { None };
        let choice = choose_window_mode(cfg.window, &ModeInputs { sys: &sys, cpus: &cpus, kernel, pause_probe: probe })
            .map_err(|e| anyhow!(e))?;
        log::info!("{}", choice.reason);
        let pid = cfg.pid.unwrap_or(-1);
        if cfg.per_thread && pid < 0 {
            bail!("per-thread mode needs a target pid");
        }
        let targets: Vec<i32> = if cfg.per_thread { vec![-1] } else { cpus.iter().map(|&c| c as i32).collect() };
        let mut live = EtmLive { groups: Vec::new(), choice: choice.clone(), cpus: Vec::new(), clock: None, recorder: None };
        let mut trcconfigr = 0;
        for &cpu in &targets {
            let plan = build_group(&sys, cpu, choice.mode, &cfg.params, &cfg.opts).context("building the event group")?;
            trcconfigr = plan.trcconfigr;
            let spec = GroupSpec {
                cpu,
                pid: if cfg.per_thread { pid } else { -1 },
                plan,
                data_bytes: cfg.data_bytes,
                aux_bytes: cfg.aux_bytes,
                bpf_output: !cfg.per_thread,
            };
            let mut g = group::open(&spec, bpf).context("opening the cs_etm event group")?;
            g.stream.target = cfg.pid.filter(|&p| p > 0).map(|p| p as u32);
            live.groups.push(g);
        }
        live.cpus = cpus.iter().filter_map(|&c| sys.cpu(c)).map(|c| cpu_trace_config(c, trcconfigr)).collect();
        if let Some(g) = live.groups.first() {
            live.clock = clock::clock_params(&g.buf.page());
        }
        if !sys.has_virtual_ts() {
            log::warn!(
                "not every ETM's ts_source is the virtual counter (1): trace timestamps may not convert to the perf clock (perf keeps them raw in that case)"
            );
        }
        if live.clock.is_none() {
            log::warn!("no cap_user_time_zero: ETM timestamps cannot be converted to the perf clock");
        }
        if let Some(dir) = &cfg.record {
            let mut notes = std::collections::HashMap::new();
            notes.insert("kernel".to_string(), kernel.to_string());
            notes.insert("window_choice".to_string(), choice.reason.clone());
            notes.insert("sysfs".to_string(), sys.summary());
            let meta = SessionMeta {
                source: SessionSource::Live,
                target: TargetInfo { pid: i64::from(pid), command: cfg.command.clone() },
                cpus: live.cpus.clone(),
                clock: live.clock,
                branch_depth: cfg.branch_depth,
                window: etm_session::session::WindowParams {
                    mode: format!("{:?}", choice.mode).to_lowercase(),
                    unit: "cycles".into(),
                    window: cfg.params.window,
                    period: cfg.params.period,
                },
                notes,
                ..Default::default()
            };
            live.recorder = Some(Recorder::create(dir, meta, cfg.copy_images)?);
            let n = save_sysfs(&cfg.sysfs_root, &dir.join("sysfs")).context("saving the cs_etm sysfs metadata")?;
            log::info!("recorded {n} sysfs files under {}", dir.join("sysfs").display());
        }
        Ok(live)
    }

    /// The one-line explanation of the window mode.
    pub fn mode_line(&self) -> &str {
        &self.choice.reason
    }

    /// The pipeline configuration for this collection.
    pub fn pipeline_config(&self, depth: usize) -> PipelineConfig {
        let mut c = PipelineConfig { cpus: self.cpus.clone(), clock: self.clock, ..Default::default() };
        c.join.depth = depth;
        c
    }

    /// Enables the groups (with aux_start_paused the trace stays off until the first resume).
    pub fn enable(&self) -> anyhow::Result<()> {
        for g in &self.groups {
            g.enable().with_context(|| format!("enabling the group of cpu {}", g.cpu))?;
        }
        Ok(())
    }

    /// Waits up to `timeout_ms` for data, then drains every buffer into `pipeline` (and the
    /// recording). Returns the number of records consumed.
    pub fn poll(&mut self, timeout_ms: i32, pipeline: Option<&mut dyn EventSink>) -> anyhow::Result<usize> {
        let mut fds: Vec<libc::pollfd> =
            self.groups.iter().map(|g| libc::pollfd { fd: g.buf.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 }).collect();
        // SAFETY: fds is a valid array of pollfd for the duration of the call.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e).context("poll");
            }
        }
        Ok(self.drain(pipeline))
    }

    /// Drains every buffer now.
    pub fn drain(&mut self, pipeline: Option<&mut dyn EventSink>) -> usize {
        let mut consumer = Consumer { pipeline, recorder: self.recorder.as_mut() };
        let mut n = 0;
        for g in &mut self.groups {
            n += g.stream.drain(&mut g.buf, &mut consumer);
        }
        n
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
        self.groups.iter().map(|g| (g.cpu, g.stream.stats)).collect()
    }

    /// Disables the groups, drains what is left, and finishes the recording (trace IDs from
    /// AUX_OUTPUT_HW_ID records are written into its metadata).
    pub fn finish(mut self, pipeline: Option<&mut dyn EventSink>) -> anyhow::Result<Option<SessionMeta>> {
        for g in &self.groups {
            let _ = g.disable();
        }
        self.drain(pipeline);
        let Some(mut rec) = self.recorder.take() else { return Ok(None) };
        for g in &self.groups {
            if g.cpu < 0 {
                continue;
            }
            if let (Some(h), Some(c)) = (g.stream.hw_ids.last(), rec.meta_mut().cpus.iter_mut().find(|c| c.cpu == g.cpu)) {
                c.trace_id = h.trace_id;
                c.sink_id = h.sink_id;
            }
        }
        if rec.errors > 0 {
            log::warn!("{} recording errors", rec.errors);
        }
        Ok(Some(rec.finish()?))
    }
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
    /// TRCCONFIGR carried through, virtual timestamps.
    #[test]
    fn trace_config_from_fixture() {
        let sys = CsEtmSystem::discover(&fixture("n1-etr")).unwrap();
        let c = cpu_trace_config(sys.cpu(3).unwrap(), 0x9880);
        assert_eq!(c.cpu, 3);
        assert_eq!(c.arch, etm_session::session::TraceArch::Etmv4);
        assert_eq!(c.trace_id, 0x16);
        assert_eq!((c.trcidr0, c.trcidr1, c.trcidr2, c.trcconfigr, c.ts_source), (0x28000ea1, 0x4100f423, 0x20001088, 0x9880, 1));
        let v2 = CsEtmSystem::discover(&fixture("v2-trbe")).unwrap();
        let c = cpu_trace_config(v2.cpu(1).unwrap(), 0);
        assert_eq!((c.arch, c.trace_id, c.trcdevarch), (etm_session::session::TraceArch::Ete, 0x12, 0x47715a13));
    }

    /// The live drain feeds the shared pipeline correctly: windows written into a fake AUX
    /// ring (toy trace format) with their PERF_RECORD_AUX, each followed by a pause sample with
    /// a kernel callchain, come out of the pipeline's join as hybrid samples carrying exactly
    /// that window's branches (newest first); a window whose AUX record is TRUNCATED is not
    /// joined, and the windows after it are.
    #[test]
    fn drain_feeds_pipeline_join() {
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
        assert_eq!(*got.borrow(), want);
        assert_eq!(ring.reenables, 1, "the TRUNCATED record must re-enable the event");
        assert_eq!(p.stats().aux_truncated, 1);
    }

    /// The saved sysfs metadata of a recording rediscovers to the same system as the original
    /// tree (both fixtures, symlinked CPUs included).
    #[test]
    fn saved_sysfs_rediscovers() {
        for name in ["n1-etr", "v2-trbe"] {
            let dir = tempfile::tempdir().unwrap();
            let n = save_sysfs(&fixture(name), dir.path()).unwrap();
            assert!(n > 30, "{name}: {n} files");
            let a = CsEtmSystem::discover(&fixture(name)).unwrap();
            let b = CsEtmSystem::discover(dir.path()).unwrap();
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
        let e = EtmLive::open(&cfg, &mut etm_live::group::NoBpf).err().unwrap();
        assert!(format!("{e:#}").contains("no cs_etm"), "{e:#}");
    }

    /// The recorded session holds exactly what the stream consumed from a fake ring: the AUX
    /// bytes with their record boundaries, the pause sample, the sideband (and the image of an
    /// executable MMAP2), readable back with the replay engineer's SessionReader.
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
    }
}
