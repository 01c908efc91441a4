//! `etm-bpf run`: live call-stack profiling of one process, running (`--pid`) or started
//! by us (`-- CMD [ARGS...]`, held before its exec until the events are in place).
//!
//! Opens a sampling perf event on every CPU (hardware cycles if the PMU has them, else the
//! `cpu-clock` software event), attaches the eBPF sampler (which keeps samples of the target's
//! threads only, so threads created later are covered), drains its ring buffer with tokio,
//! resolves and symbolizes the stacks into a calling-context trie, and shows the live view
//! (or a one-line summary per second with `--headless`), dumping the profile periodically.

use std::collections::HashMap;
use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use etm_bpf_common::{FLAG_READ_BRANCHES, REC_HAS_BRANCHES, SampleRecord};
use etm_perf::attr::{WindowMode, WindowParams};
use etm_session::PipelineConfig;
use etm_session::session::{BranchPair, CodeArch, PauseSample, SessionEvent, SessionMeta, SessionSource, TargetInfo};
use tokio::io::unix::AsyncFd;
use tokio::signal::unix::{SignalKind, signal};

use crate::dump::check_writable_dir;
use crate::dumper::DumpJob;
use crate::engine::{DumpMeta, Engine, pipeline_json};
use crate::launch::{Held, RunAs, Stdio};
use crate::live::bpf::{BpfCounters, SampleBpf};
use crate::live::etm::{EtmConfig, EtmLive, Recorder, cs_etm_present};
use crate::live::maps::{MapsTracker, load_image};
use crate::live::perf_event::{SampleEvent, open_per_cpu, open_per_thread};
use crate::tui::app::{App, Key, Snapshot, Status, rows_from_trie};
use crate::unwind::UnwindMode;
use etm_perf::host::BranchScope;

/// Where branch records come from.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Branches {
    /// ETM when a cs_etm PMU exists, else LBR when the PMU has it, else none.
    Auto,
    /// Stack-only samples.
    None,
    /// Intel LBR / Arm BRBE through perf branch sampling (fails if unavailable).
    Lbr,
    /// CoreSight ETM/ETE windows closed by a pause event (fails without a cs_etm PMU).
    Etm,
}

/// Where LBR/BRBE branch events are opened.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum BranchEvents {
    /// Per-thread unless the kernel is known to have the sched_task fixes (docs/lbr.md).
    Auto,
    /// One event per target thread, inherited by threads created later.
    Thread,
    /// One event per CPU for every task (the BPF program keeps the target's samples).
    Cpu,
}

/// ETM window mode (`--branches etm`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// Hardware stagger: pause on the PMU's trcextout1 event.
    Hw,
    /// Free-running pause/resume on cycles with aperiodic periods.
    Free,
    /// autofdo strobing preset (kernels without AUX pause).
    Strobe,
}

#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["pid", "command"])))]
#[command(after_help = "Examples:\n  \
    sudo etm-bpf run --pid 1234\n  \
    sudo etm-bpf run --pid 1234 --headless --duration 5 --dump-dir out\n  \
    sudo etm-bpf run --headless --dump-dir out -- ./bench --iterations 10\n\n\
    With -- CMD, etm-bpf starts CMD itself (profiled from its first instruction), stops when\n\
    it exits and exits with its status (128+N if signal N killed it). Under sudo CMD runs as\n\
    the invoking user (SUDO_UID/SUDO_GID; --as-root keeps root). Its standard streams are the\n\
    terminal's, except with the live view: then stdin is /dev/null and its output goes to\n\
    DUMP_DIR/command.out (else /tmp/etm-bpf-<etm-bpf pid>-command.out), named in the status\n\
    line; etm-bpf's own lines go to stderr. SIGINT/SIGTERM are passed on to CMD (a second one\n\
    stops profiling at once); when --duration ends or the live view quits, CMD gets SIGTERM.\n\n\
    Several processes (--pid 12,34): one complete dump each in DUMP_DIR/pid-12/, DUMP_DIR/pid-34/\n\
    (one in DUMP_DIR with --merge); a process that exits is said and counted, the others go on,\n\
    the run stops when all have exited. --follow-children adds every process a target forks\n\
    (and they fork) to that target's profile, exec'd binaries included.\n\n\
    Needs root (CAP_BPF + CAP_PERFMON, or CAP_SYS_ADMIN). Stacks are unwound with DWARF CFI\n\
    from a copy of the top of the user stack (--unwind auto); --unwind fp uses frame pointers\n\
    only (targets built with -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer).")]
pub struct RunArgs {
    /// Process to profile (all its threads, including ones created later); several as
    /// `--pid 12,34` or a repeated `--pid`: one profile each, in DUMP_DIR/pid-N/ (or one with
    /// --merge).
    #[arg(long, conflicts_with = "command", value_delimiter = ',', num_args = 1)]
    pub pid: Vec<u32>,
    /// With several --pid: one profile of all of them instead of one per process.
    #[arg(long)]
    pub merge: bool,
    /// Also profile the processes the targets fork from now on (and theirs), from their first
    /// instruction: each in the profile of the target it descends from.
    #[arg(long)]
    pub follow_children: bool,
    /// Command to start and profile (after `--`), with its arguments.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<std::ffi::OsString>,
    /// With `-- CMD` under sudo: run CMD as root instead of the invoking user.
    #[arg(long, requires = "command")]
    pub as_root: bool,
    /// Sampling frequency in Hz.
    #[arg(long, default_value_t = 999)]
    pub freq: u64,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// No live view: one summary line per second, top contexts at the end.
    #[arg(long)]
    pub headless: bool,
    /// Write profile.folded, profile.pb.gz and manifest.json here.
    #[arg(long)]
    pub dump_dir: Option<PathBuf>,
    /// Seconds between dumps (and once more at exit).
    #[arg(long, default_value_t = 10.0)]
    pub dump_every: f64,
    /// Branch-history source joined to each stack.
    #[arg(long, value_enum, default_value_t = Branches::Auto)]
    pub branches: Branches,
    /// Where LBR/BRBE branch events are opened: per target thread or per CPU.
    #[arg(long, value_enum, default_value_t = BranchEvents::Auto)]
    pub branch_events: BranchEvents,
    #[command(flatten)]
    pub etm: EtmArgs,
    /// Branch records kept per hybrid sample [default: ETM 32; LBR/BRBE every record the
    /// hardware gives, up to 64].
    #[arg(long)]
    pub depth: Option<u32>,
    /// Save everything the live path consumed (samples, sideband, AUX data, code images) as
    /// a session directory that `etm-bpf replay` reads.
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Memory bound of the context trie (number of contexts).
    #[arg(long, default_value_t = 200_000)]
    pub max_contexts: usize,
    /// With ETM: no exact per-function counts from the trace (functions.csv, contexts.csv,
    /// instructions.folded/svg, the view's instr and per-call columns): saves their cost per decoded range.
    #[arg(long)]
    pub no_exact: bool,
    /// With ETM: no synthesized samples inside the windows (by default a window longer than
    /// --depth branches also gives a hybrid sample every --depth branches back from its pause,
    /// its stack unwound backwards through the window's calls and returns, for the PGO dumps).
    #[arg(long)]
    pub no_synth_samples: bool,
    /// Which samples the profile keeps for the `<binary>.perfscript` dumps: `needed` (those of
    /// pseudo-probe binaries, whose context-sensitive `.unsym.txt` LLVM 22 cannot read, and of
    /// binaries without code facts), or `all`. The `.unsym.txt` and `.bolt.pa` dumps count
    /// every sample either way.
    #[arg(long, value_enum, default_value_t)]
    pub perfscript: crate::cmd::Perfscript,
    /// With ETM: threads decoding the per-CPU trace streams (each stream on one; the join and
    /// the profile stay on the main thread, the profile is the same with any number): a
    /// number, or `auto` = the smaller of the cores and the traced CPUs. 1 (the default)
    /// decodes on the drain loop's thread, so profiling costs at most one core.
    #[arg(long, default_value = "1", value_parser = crate::cmd::parse_threads)]
    pub decode_threads: crate::cmd::Threads,
    /// Log file in live-view mode (default: DUMP_DIR/etm-bpf.log, else /tmp/etm-bpf-PID.log).
    #[arg(long)]
    pub log_file: Option<PathBuf>,
    /// How user stacks are unwound: frame pointers, DWARF CFI (.eh_frame/.debug_frame) over
    /// a copy of the top of the user stack, or auto (DWARF whenever the copy unwinds past the
    /// sampled function, else frame pointers).
    #[arg(long, value_enum, default_value_t = UnwindMode::Auto)]
    pub unwind: UnwindMode,
    /// Bytes of the user stack copied per sample for DWARF unwinding: 4096, 8192, 16384 or
    /// 32768. Deeper stacks are cut at the copy's end (counted as truncated).
    #[arg(long, default_value_t = etm_bpf_common::DEFAULT_STACK_BYTES as u32)]
    pub stack_size: u32,
}

/// The sample ring's size: a quarter second of records at `freq` on `cpus` CPUs (user space
/// drains every 100 ms), a power of two between the default 4 MiB and 256 MiB.
pub fn ring_bytes(record: usize, freq: u64, cpus: usize) -> u32 {
    let want = (record as u64 + etm_bpf_common::RINGBUF_HDR_SZ).saturating_mul(freq).saturating_mul(cpus.max(1) as u64) / 4;
    want.next_power_of_two().clamp(u64::from(etm_bpf_common::RING_BYTES), 256 << 20) as u32
}

/// The CoreSight options `run` and `doctor` share.
#[derive(clap::Args, Debug, Clone)]
pub struct EtmArgs {
    /// ETM window mode (default: the best the kernel and PMU support).
    #[arg(long, value_enum)]
    pub window: Option<Window>,
    /// ETM window length W in cycles (hw: pause period; free: mean window); raised to keep the
    /// interrupt rate within --irq-budget and the kernel's perf_event_max_sample_rate
    /// [default: 1000, raised to the budget without a warning].
    #[arg(long)]
    pub etm_window: Option<u64>,
    /// ETM distance between window starts R in cycles (strobe: sampling period)
    /// [default: 1000003].
    #[arg(long)]
    pub etm_period: Option<u64>,
    /// autofdo strobing preset for `--window strobe` (1..=9).
    #[arg(long, default_value_t = WindowParams::default().strobe_preset)]
    pub strobe_preset: u8,
    /// Interrupts per second per CPU the pause and resume events may cost together.
    #[arg(long, default_value_t = etm_perf::plan::DEFAULT_IRQ_BUDGET)]
    pub irq_budget: u64,
    /// AUX ring bytes per buffer (rounded up to a power of two of pages).
    #[arg(long, default_value_t = 4 << 20)]
    pub aux_size: usize,
    /// Trace the target's main thread with one group following it (per-thread) instead of
    /// every CPU.
    #[arg(long)]
    pub per_thread: bool,
    /// sysfs root for cs_etm discovery (a captured tree, or a `run --record` directory).
    #[arg(long, default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// proc root for the kernel's settings (a captured tree).
    #[arg(long, default_value = "/proc")]
    pub proc_root: PathBuf,
}

impl EtmArgs {
    /// The collection configuration these options ask for. A `run --record` directory as the
    /// sysfs root means its `sysfs/` and `proc/` copies.
    pub fn config(&self) -> EtmConfig {
        let (sysfs_root, proc_root) = if self.sysfs_root.join("session.json").exists() {
            (self.sysfs_root.join("sysfs"), self.sysfs_root.join("proc"))
        } else {
            (self.sysfs_root.clone(), self.proc_root.clone())
        };
        EtmConfig {
            sysfs_root,
            proc_root,
            window: self.window.map(|w| match w {
                Window::Hw => WindowMode::Hw,
                Window::Free => WindowMode::Free,
                Window::Strobe => WindowMode::Strobe,
            }),
            params: WindowParams {
                window: self.etm_window.unwrap_or(WindowParams::default().window),
                period: self.etm_period.unwrap_or(WindowParams::default().period),
                strobe_preset: self.strobe_preset,
            },
            params_explicit: self.etm_window.is_some() || self.etm_period.is_some(),
            irq_budget: self.irq_budget,
            aux_bytes: self.aux_size,
            per_thread: self.per_thread,
            ..Default::default()
        }
    }
}

/// Fails unless this process may load BPF programs and open system-wide perf events.
pub(crate) fn check_privileges() -> anyhow::Result<()> {
    use etm_perf::host::{CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN};
    let status = std::fs::read_to_string("/proc/self/status").context("read /proc/self/status")?;
    let caps =
        status.lines().find_map(|l| l.strip_prefix("CapEff:")).and_then(|v| u64::from_str_radix(v.trim(), 16).ok()).unwrap_or(0);
    let has = |bit: u32| caps & (1u64 << bit) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return Ok(());
    }
    bail!(
        "permission denied: `run` needs root, or the capabilities CAP_BPF and CAP_PERFMON \
         (or CAP_SYS_ADMIN), to load the eBPF program and open perf events (try sudo)"
    )
}

/// The state character of `/proc/PID/stat` (`R`, `S`, `Z`, ...), `None` if gone.
fn proc_state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ...; comm may contain spaces and parentheses.
    s.rsplit_once(')')?.1.trim_start().chars().next()
}

fn alive(pid: u32) -> bool {
    matches!(proc_state(pid), Some(c) if c != 'Z' && c != 'X' && c != 'x')
}

fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| b.split(|&c| c == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect())
        .unwrap_or_default()
}

/// Branch records kept per ETM sample unless `--depth` says otherwise.
const ETM_DEPTH: u32 = 32;

/// Session note with the context trie's node bound, so a replay bounds it the same way.
pub const TRIE_NODES_NOTE: &str = "trie_nodes";

/// Session note with `--unwind` (`fp` when the pause records carry no stack copy), so a
/// replay unwinds the recorded copies the same way.
pub const UNWIND_NOTE: &str = "unwind";

/// `--unwind`'s spelling on the command line (and in [`UNWIND_NOTE`]).
pub fn unwind_name(m: UnwindMode) -> String {
    clap::ValueEnum::to_possible_value(&m).map(|v| v.get_name().to_string()).unwrap_or_default()
}

/// Pause records the cs_etm leader's data ring holds between two drains when they carry
/// stack copies.
const ETM_RING_RECORDS: usize = 256;

/// The leader's data ring: `default`, or with stack copies of `stack_bytes` room for
/// [`ETM_RING_RECORDS`] pause records of that size (a power of two).
pub fn etm_data_bytes(default: usize, stack_bytes: u32) -> usize {
    if stack_bytes == 0 {
        return default;
    }
    let record = etm_bpf_common::pause_raw_bytes(0, Some(stack_bytes as usize)) + 64;
    (record * ETM_RING_RECORDS).next_power_of_two().max(default)
}

/// Everything the dumps and the status line report.
struct RunInfo {
    /// The first target.
    pid: u32,
    /// The targets (`--pid`, or the launched command).
    pids: Vec<u32>,
    /// One profile per target, in `pid-N/` (several targets without `--merge`).
    per_pid: bool,
    /// `--merge`.
    merge: bool,
    /// `--follow-children`.
    follow: bool,
    command: Vec<String>,
    /// The sampling event (stack-only/LBR) or the ETM mode.
    event: String,
    branches: &'static str,
    freq: u64,
    start: SystemTime,
    window_line: Option<String>,
    /// `-- CMD`: the file its output goes to (live view).
    output: Option<PathBuf>,
    /// `-- CMD`: etm-bpf's own lines go to stderr, the command's stdout stays its own.
    launched: bool,
}

impl RunInfo {
    /// Where etm-bpf's status lines and summary go: stdout, or stderr with `-- CMD`.
    fn out(&self) -> Box<dyn std::io::Write> {
        if self.launched { Box::new(std::io::stderr()) } else { Box::new(std::io::stdout()) }
    }
}

/// CLOCK_MONOTONIC now, in ns (the clock of eBPF sample times).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The live driver's side of the one pipeline: everything collected goes through
/// [`Feed::event`] into the [`Engine`] (and the recording), exactly as `replay` feeds it.
struct Feed {
    /// The target whose profile this is (the first one with `--merge`).
    pid: u32,
    /// The target's command line.
    command: Vec<String>,
    engine: Engine,
    /// The dump thread (after the loop: for the final dump).
    dumper: Option<crate::dumper::Dumper>,
    /// The maps of every process in this profile: the target(s) first, then followed children.
    maps: Vec<MapsTracker>,
    /// The processes of `maps` that exited.
    exited: Vec<u32>,
    /// `--branches etm`: events pass through the ETM collection (its recorder).
    etm: Option<EtmLive>,
    /// The ETM collection's final counters (after `etm` is finished).
    etm_counts: Option<serde_json::Value>,
    /// Stack-only/LBR `--record`.
    recorder: Option<Recorder>,
    /// Ring-buffer records that were too short.
    bad_records: u64,
    /// Records of another process (the kernel side filters; counted if it does not).
    foreign: u64,
    /// Records with an empty stack.
    empty: u64,
    sideband: Vec<etm_session::session::Sideband>,
    /// Why the loop stopped.
    stop: Option<StopReason>,
    scratch: PauseSample,
    spare_branches: Option<Vec<BranchPair>>,
    /// `--unwind`.
    unwind: UnwindMode,
    /// The DWARF unwinder's output, reused.
    unwound: Vec<u64>,
}

impl Feed {
    fn event(&mut self, ev: SessionEvent<'_>) {
        match self.etm.as_mut() {
            Some(etm) => etm.push_event(ev, Some(&mut self.engine)),
            None => {
                if let Some(r) = self.recorder.as_mut() {
                    r.event(&ev);
                }
                self.engine.push(ev);
            }
        }
    }

    /// Re-reads the maps of the profile's running processes and feeds new executable mappings
    /// as MMAP2 records.
    fn reload_maps(&mut self) -> std::io::Result<()> {
        let mut last = Ok(());
        for i in 0..self.maps.len() {
            if !self.exited.contains(&self.maps[i].pid())
                && let Err(e) = self.reload_maps_of(i)
            {
                last = Err(e);
            }
        }
        last
    }

    /// [`Feed::reload_maps`] of one process (index in `maps`).
    fn reload_maps_of(&mut self, i: usize) -> std::io::Result<()> {
        let mut sb = std::mem::take(&mut self.sideband);
        sb.clear();
        let changed = self.maps[i].reload(monotonic_ns(), &mut sb)?;
        if changed {
            // Old addresses may now belong to other code (exec, dlclose + dlopen).
            self.engine.pipeline_mut().clear_frame_cache();
        }
        for s in &sb {
            self.event(SessionEvent::Sideband(s));
        }
        self.sideband = sb;
        Ok(())
    }

    /// One record of the eBPF ring.
    fn sample(&mut self, bytes: &[u8]) {
        let Some(rec) = SampleRecord::from_bytes(bytes) else {
            self.bad_records += 1;
            return;
        };
        let Some(proc_idx) = self.maps.iter().position(|m| m.pid() == rec.pid) else {
            self.foreign += 1;
            return;
        };
        let fp_stack = rec.stack();
        if fp_stack.is_empty() {
            self.empty += 1;
            return;
        }
        let stack = self.choose_stack(bytes, fp_stack);
        if !self.engine.resolves(fp_stack)
            && self.maps[proc_idx].reload_due(rec.time_ns)
            && let Err(e) = self.reload_maps_of(proc_idx)
        {
            log::debug!("re-reading maps of {}: {e}", rec.pid);
        }
        // One sample buffer reused for every record (no allocation per sample).
        let mut s = std::mem::take(&mut self.scratch);
        s.cpu = rec.cpu as i32;
        s.pid = rec.pid;
        s.tid = rec.tid;
        s.time = rec.time_ns;
        s.stack.clear();
        match stack {
            Chosen::Fp => s.stack.extend_from_slice(fp_stack),
            Chosen::Dwarf => s.stack.extend_from_slice(&self.unwound),
        }
        fill_branches(&rec, &mut s, &mut self.spare_branches);
        self.event(SessionEvent::Sample(&s));
        if let Some(v) = s.branches.take() {
            self.spare_branches = Some(v);
        }
        self.scratch = s;
    }

    /// Which stack a record contributes ([`crate::unwind::DwarfUnwinder::choose`]: the DWARF
    /// unwind of its stack copy into `unwound`, or the frame-pointer one).
    fn choose_stack(&mut self, bytes: &[u8], fp_stack: &[u64]) -> Chosen {
        let Some(u) = self.engine.unwinder_mut() else {
            return Chosen::Fp;
        };
        if u.choose(self.unwind, etm_bpf_common::UserRegs::parse(bytes), fp_stack, &mut self.unwound) {
            Chosen::Dwarf
        } else {
            Chosen::Fp
        }
    }

    /// Drains the ETM buffers: AUX records, the pause program's records and the sideband,
    /// in ring order (samples are joined once their CPU's trace after them, or the
    /// collection's proof that everything up to them arrived, has been seen).
    fn drain_etm(&mut self) {
        if let Some(etm) = self.etm.as_mut() {
            etm.tick(Some(&mut self.engine));
        }
    }
}

/// The unwinding counts of the manifest.
fn unwind_json(e: &Engine, k: &BpfCounters) -> serde_json::Value {
    let u = e.unwinder().map(|u| u.stats).unwrap_or_default();
    let mut v = crate::engine::unwind_counts(e);
    v["unwind_ns_per_sample"] = serde_json::json!(u.unwind_ns.checked_div(u.unwinds).unwrap_or(0));
    v["kernel_copy_errors"] = serde_json::json!(k.ustack_err);
    v["kernel_mode_samples"] = serde_json::json!(k.ustack_kernel);
    v["kernel_copies_shortened"] = serde_json::json!(k.ustack_short);
    v
}

/// The stack [`Feed::choose_stack`] picked.
enum Chosen {
    Fp,
    Dwarf,
}

/// The branch stack of a ring record into `s`: `None` when the program read none, else the
/// entries (possibly none: an empty branch stack is kept as such, for the pipeline to count)
/// with each entry's `perf_branch_entry` flag word (the pipeline drops wrong-path and abort
/// entries and checks branch types with it).
fn fill_branches(rec: &SampleRecord, s: &mut PauseSample, spare: &mut Option<Vec<BranchPair>>) {
    s.branch_flags.clear();
    s.branches = (rec.flags & REC_HAS_BRANCHES != 0).then(|| {
        let br = rec.branches();
        let mut v = spare.take().unwrap_or_default();
        v.clear();
        v.extend(br.iter().map(|b| BranchPair { from: b.from, to: b.to }));
        s.branch_flags.extend(br.iter().map(|b| b.flags));
        v
    });
}

pub fn main(args: RunArgs) -> anyhow::Result<ExitCode> {
    if args.freq == 0 || args.freq > 100_000 {
        bail!("--freq must be between 1 and 100000 Hz (got {})", args.freq);
    }
    if !(args.dump_every > 0.0 && args.dump_every.is_finite()) {
        bail!("--dump-every must be a positive number of seconds");
    }
    if let Some(d) = args.duration
        && !(d > 0.0 && d.is_finite())
    {
        bail!("--duration must be a positive number of seconds");
    }
    if !etm_bpf_common::STACK_SIZES.contains(&(args.stack_size as usize)) {
        bail!("--stack-size must be one of 4096, 8192, 16384, 32768 (got {})", args.stack_size);
    }
    if args.depth.is_some_and(|d| d == 0 || d > 1024) {
        bail!("--depth must be between 1 and 1024");
    }
    if !args.headless && !std::io::stdout().is_terminal() {
        bail!("the live view needs a terminal on stdout; use --headless");
    }
    let mut targets: Vec<u32> = Vec::new();
    for &pid in &args.pid {
        if pid == 0 || !alive(pid) {
            bail!("no such process: {pid}");
        }
        if !targets.contains(&pid) {
            targets.push(pid);
        }
    }
    // The kernel keeps a set of processes (a BPF hash map) instead of one tgid.
    let tgid_set = targets.len() > 1 || args.follow_children;
    if let Some(d) = &args.dump_dir {
        check_writable_dir(d)?;
    }
    if let Some(d) = &args.record {
        check_writable_dir(d).context("--record")?;
        if tgid_set {
            bail!("--record records one process: it cannot be combined with several --pid or --follow-children");
        }
    }
    let has_etm = cs_etm_present(&args.etm.sysfs_root);
    if args.branches == Branches::Etm && !has_etm {
        bail!(
            "--branches etm: no cs_etm PMU ({} is missing): this machine has no CoreSight ETM/ETE trace",
            args.etm.sysfs_root.join(etm_perf::discovery::EVENT_SOURCE).join(etm_perf::discovery::CS_ETM).display()
        );
    }
    if args.branches == Branches::Etm && tgid_set {
        bail!("--branches etm profiles one process: several --pid and --follow-children work with --branches none|lbr");
    }
    if args.branches != Branches::Etm && args.etm.window.is_some() {
        bail!("--window applies to --branches etm only");
    }
    check_privileges()?;
    // `-- CMD`: forked now, held before its exec until the events are in place.
    let mut held = None;
    let mut command_output = None;
    if targets.is_empty() {
        let run_as = if args.as_root { None } else { RunAs::from_sudo_env()? };
        let stdio = if args.headless {
            Stdio::Inherit
        } else {
            let path = match &args.dump_dir {
                Some(d) => d.join("command.out"),
                None => PathBuf::from(format!("/tmp/etm-bpf-{}-command.out", std::process::id())),
            };
            command_output = Some(path.clone());
            Stdio::File(path)
        };
        let h = Held::spawn(&args.command, run_as.as_ref(), &stdio)?;
        targets.push(h.pid());
        held = Some(h);
    }
    let pid = targets[0];
    if args.headless {
        crate::logging::init_stderr();
    } else {
        let path = args.log_file.clone().unwrap_or_else(|| match &args.dump_dir {
            Some(d) => d.join("etm-bpf.log"),
            None => PathBuf::from(format!("/tmp/etm-bpf-{pid}.log")),
        });
        crate::logging::init_file(&path)?;
    }

    let command: Vec<String> = match &held {
        Some(_) => args.command.iter().map(|a| a.to_string_lossy().into_owned()).collect(),
        None => cmdline(pid),
    };
    let per_pid = targets.len() > 1 && !args.merge;
    // One profile per target, or one for all: (first target, every target in it).
    let groups: Vec<Vec<u32>> = if per_pid { targets.iter().map(|&p| vec![p]).collect() } else { vec![targets.clone()] };
    let mut trackers: Vec<Vec<MapsTracker>> = Vec::new();
    let mut initial: Vec<Vec<etm_session::session::Sideband>> = Vec::new();
    for g in &groups {
        let mut ts = Vec::new();
        let mut sb = Vec::new();
        for &p in g {
            let mut maps = MapsTracker::new(p);
            // A held command's maps are read once it has exec'd.
            if held.is_none()
                && let Err(e) = maps.reload(monotonic_ns(), &mut sb)
            {
                if !alive(p) {
                    bail!("process {p} exited during start-up");
                }
                return Err(e).with_context(|| format!("cannot read /proc/{p}/maps"));
            }
            ts.push(maps);
        }
        trackers.push(ts);
        initial.push(sb);
    }
    let loader = || -> crate::engine::ImageLoader { Box::new(load_image) };
    let use_etm = args.branches == Branches::Etm || (args.branches == Branches::Auto && has_etm && !tgid_set);
    if args.branches == Branches::Auto && has_etm && tgid_set {
        log::warn!("ETM windows take one process: with several --pid or --follow-children, branches come from LBR/BRBE or none");
    }
    let cpus = aya::util::online_cpus().map_err(|(what, e)| anyhow::anyhow!("cannot list online CPUs ({what}): {e}"))?;
    let info_for = |event: String, branches: &'static str, window_line: Option<String>| RunInfo {
        pid,
        pids: targets.clone(),
        per_pid,
        merge: args.merge,
        follow: args.follow_children,
        command: command.clone(),
        event,
        branches,
        freq: args.freq,
        start: SystemTime::now(),
        window_line,
        output: None,
        launched: false,
    };

    let stack_bytes = if args.unwind == UnwindMode::Fp { 0 } else { args.stack_size };
    let (mut bpf, info, mut feeds) = if use_etm {
        let mut bpf = SampleBpf::load_windows(pid, 0, stack_bytes)
            .context("BPF is unavailable (kernel without BPF, lockdown, or missing privileges)")?;
        let base = args.etm.config();
        let cfg = EtmConfig {
            pid: Some(pid as i32),
            record: args.record.clone(),
            branch_depth: args.depth.unwrap_or(ETM_DEPTH),
            command: command.clone(),
            data_bytes: etm_data_bytes(base.data_bytes, stack_bytes),
            ..base
        };
        let mut etm = EtmLive::open(&cfg, &bpf).context("--branches etm")?;
        bpf.set_window_flags(etm.window_flags()).context("configuring the window programs")?;
        etm.note(TRIE_NODES_NOTE, args.max_contexts.to_string());
        etm.note(UNWIND_NOTE, unwind_name(if stack_bytes == 0 { UnwindMode::Fp } else { args.unwind }));
        let mode = etm.mode_line().to_string();
        let mut pc = etm.pipeline_config(args.depth.unwrap_or(ETM_DEPTH) as usize);
        pc.trie_nodes = args.max_contexts;
        pc.exact = !args.no_exact;
        pc.profile.keep_samples = args.perfscript.keep();
        pc.join.synth_samples = if args.no_synth_samples { 0 } else { etm_session::join::DEFAULT_SYNTH_SAMPLES };
        pc.decode_threads = args.decode_threads.count(pc.cpus.len());
        let mut engine = Engine::new(pc, Some(loader()));
        if stack_bytes != 0 {
            engine.enable_unwinding(args.unwind);
        }
        let info = info_for("cs_etm pause".into(), "etm", Some(mode));
        let maps = trackers.pop().expect("one target");
        (bpf, info, vec![Feed::new(pid, command.clone(), engine, maps, Some(etm), None)])
    } else {
        if args.decode_threads != crate::cmd::Threads::N(1) {
            log::warn!("--decode-threads applies to ETM trace only; these branches need no decoding");
        }
        let host = etm_perf::host::HostFacts::read(std::path::Path::new("/proc"), std::path::Path::new("/sys"));
        let requested = match args.branch_events {
            BranchEvents::Auto => None,
            BranchEvents::Thread => Some(BranchScope::PerThread),
            BranchEvents::Cpu => Some(BranchScope::CpuWide),
        };
        let scope = etm_perf::host::branch_event_scope(host.kernel, cfg!(target_arch = "aarch64"), requested);
        let (event, fds, branches, scope_line) = open_events(args.freq, args.branches, &cpus, &targets, &scope)?;
        let mut flags = if branches == "lbr" { FLAG_READ_BRANCHES } else { 0 };
        if tgid_set {
            flags |= etm_bpf_common::FLAG_TGID_SET;
        }
        if args.follow_children {
            flags |= etm_bpf_common::FLAG_FOLLOW_FORKS;
        }
        let record = if stack_bytes == 0 {
            etm_bpf_common::SAMPLE_RECORD_SIZE
        } else {
            etm_bpf_common::SAMPLE_RECORD_SIZE + etm_bpf_common::USER_REGS_SIZE + stack_bytes as usize
        };
        let ring = ring_bytes(record, args.freq, cpus.len());
        log::info!("sample ring {} KiB for {record}-byte records", ring >> 10);
        let mut bpf = SampleBpf::load_with_stack(if tgid_set { 0 } else { pid }, flags, stack_bytes, ring)
            .context("BPF is unavailable (kernel without BPF, lockdown, or missing privileges)")?;
        if tgid_set {
            for &t in &targets {
                bpf.add_tgid(t, t)?;
            }
        }
        if args.follow_children {
            bpf.attach_fork()?;
        }
        for fd in fds {
            bpf.attach_perf_fd(fd).context("cannot attach the eBPF program to the perf event")?;
        }
        let mut pc = PipelineConfig { trie_nodes: args.max_contexts, ..Default::default() };
        pc.profile.keep_samples = args.perfscript.keep();
        // LBR/BRBE: every record the kernel copied, unless --depth says fewer.
        let depth = args.depth.unwrap_or(etm_bpf_common::MAX_BRANCHES as u32);
        pc.join.depth = depth as usize;
        // The code checks decode the host's instructions (the recording says which, so a
        // replay checks the same way).
        pc.arch = CodeArch::host();
        let recorder = match &args.record {
            Some(dir) => {
                let mut notes = std::collections::HashMap::new();
                notes.insert("event".to_string(), event.name().to_string());
                notes.insert("frequency_hz".to_string(), args.freq.to_string());
                notes.insert("branch_source".to_string(), branches.to_string());
                if let Some(l) = &scope_line {
                    notes.insert("branch_events".to_string(), l.clone());
                }
                notes.insert("clock".to_string(), "CLOCK_MONOTONIC".to_string());
                notes.insert(TRIE_NODES_NOTE.to_string(), args.max_contexts.to_string());
                let meta = SessionMeta {
                    source: SessionSource::Live,
                    target: TargetInfo { pid: i64::from(pid), command: command.clone() },
                    branch_depth: depth,
                    window: etm_session::session::WindowParams { mode: "none".into(), ..Default::default() },
                    notes,
                    arch: CodeArch::host(),
                    ..Default::default()
                };
                Some(Recorder::create(dir, meta, true)?)
            }
            None => None,
        };
        let mut recorder = recorder;
        let mut feeds = Vec::new();
        for (g, maps) in groups.iter().zip(trackers) {
            let mut engine = Engine::new(pc.clone(), Some(loader()));
            if stack_bytes != 0 {
                engine.enable_unwinding(args.unwind);
            }
            let cmd = if g[0] == pid { command.clone() } else { cmdline(g[0]) };
            let mut feed = Feed::new(g[0], cmd, engine, maps, None, recorder.take());
            feed.unwind = if stack_bytes == 0 { UnwindMode::Fp } else { args.unwind };
            feeds.push(feed);
        }
        (bpf, info_for(event.name().to_string(), branches, scope_line), feeds)
    };
    for (feed, sb) in feeds.iter_mut().zip(&initial) {
        for s in sb {
            feed.event(SessionEvent::Sideband(s));
        }
    }
    if let Some(etm) = feeds[0].etm.as_mut() {
        etm.enable().context("enabling the cs_etm events")?;
    }
    if let Some(h) = held.as_mut() {
        // Everything is in place: let the command exec, then read its first mappings.
        h.release()?;
        if let Err(e) = feeds[0].reload_maps() {
            log::debug!("maps of {pid} right after exec: {e}");
        }
    } else if let Some(p) = targets.iter().find(|&&p| !alive(p)) {
        bail!("process {p} exited during start-up");
    }
    let mut info = info;
    info.output = command_output;
    info.launched = held.is_some();
    if let Some(line) = &info.window_line {
        log::info!("{line}");
        if args.headless {
            // The one line saying which window mode (or branch event scope) was chosen and why.
            let what = if info.branches == "etm" { "ETM window" } else { "branch events" };
            let _ = writeln!(info.out(), "etm-bpf: {what}: {line}");
        }
    }
    let switches_at_start = etm_perf::host::context_switches(std::path::Path::new("/proc"), pid);
    log::info!(
        "profiling pid {} ({}) with {} at {} Hz on {} CPUs, branches {}{}",
        targets.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
        info.command.join(" "),
        info.event,
        args.freq,
        cpus.len(),
        info.branches,
        if args.follow_children { ", following children" } else { "" }
    );

    let mut feeds = Feeds::new(feeds);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("start the tokio runtime")?;
    rt.block_on(run_loop(&args, &info, &mut bpf, &mut feeds, held.as_mut()))?;
    // Stop sampling, then drain what is left in the ring (done in run_loop); finish the
    // collection, the recording and the pipeline.
    // Which processes are gone by now (the final manifests say so).
    feeds.reap(&info, &mut bpf, held.as_mut().map(|h| h.try_wait().is_none()));
    let mut reason = StopReason::Signal;
    for feed in &mut feeds.list {
        reason = feed_finish(feed)?;
    }
    let counters = bpf.counters().unwrap_or_default();
    if let Some(dir) = &args.dump_dir {
        for feed in &mut feeds.list {
            let mut dumper = match feed.dumper.take() {
                Some(d) => d,
                None => crate::dumper::Dumper::start()?,
            };
            let job = dump_job(dir, &info, feed, &feeds.run, &counters, true, (dumper.written, dumper.skipped));
            dumper.write_now(job)?;
        }
    }
    for feed in &feeds.list {
        print_summary(reason, &info, feed, &feeds.run, &counters, args.dump_dir.as_deref(), args.record.as_deref());
    }
    if info.branches == "lbr" {
        // The cost of the scope, measured: each switch of a task with branch events wipes
        // the branch buffer (on legacy LBR, rewrites every LBR MSR).
        let end = etm_perf::host::context_switches(std::path::Path::new("/proc"), pid);
        if let ((Some(s0), Some(t0)), (Some(s1), Some(t1))) = (switches_at_start, end) {
            let _ = writeln!(
                info.out(),
                "branch-buffer wipes: per-thread events pay the target's {} context switches, CPU-wide events the system's {}",
                t1.saturating_sub(t0),
                s1.saturating_sub(s0)
            );
        }
    }
    let Some(mut h) = held else { return Ok(ExitCode::SUCCESS) };
    let status = finish_command(&mut h, reason)?;
    let _ = writeln!(info.out(), "etm-bpf: {} ({}) {}", info.command.join(" "), pid, crate::launch::describe_status(status));
    Ok(ExitCode::from(crate::launch::exit_code(status)))
}

/// After profiling stopped: a command still running after `--duration` or a quit gets
/// SIGTERM (SIGKILL 5 s later); returns its wait status.
fn finish_command(h: &mut Held, reason: StopReason) -> anyhow::Result<i32> {
    if h.try_wait().is_none() && matches!(reason, StopReason::Duration | StopReason::UserQuit | StopReason::Signal) {
        h.signal(if reason == StopReason::Signal { libc::SIGKILL } else { libc::SIGTERM });
        let t = Instant::now();
        while h.try_wait().is_none() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        h.signal(libc::SIGKILL);
    }
    h.wait().context("waiting for the command to exit")
}

/// Whether this process is in the terminal's foreground process group (so a Ctrl-C from
/// the terminal reached the command too).
fn terminal_foreground() -> bool {
    // SAFETY: tcgetpgrp and getpgrp have no memory preconditions.
    unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() }
}

impl Feed {
    fn new(
        pid: u32,
        command: Vec<String>,
        engine: Engine,
        maps: Vec<MapsTracker>,
        etm: Option<EtmLive>,
        recorder: Option<Recorder>,
    ) -> Feed {
        Feed {
            pid,
            command,
            engine,
            dumper: None,
            maps,
            exited: Vec::new(),
            etm,
            etm_counts: None,
            recorder,
            bad_records: 0,
            foreign: 0,
            empty: 0,
            sideband: Vec::new(),
            stop: None,
            scratch: PauseSample::default(),
            spare_branches: None,
            unwind: UnwindMode::Fp,
            unwound: Vec::new(),
        }
    }
}

/// What the run knows beyond each profile: which targets exited, the children followed,
/// records that belong to no profile.
#[derive(Debug, Default)]
struct RunState {
    /// Targets that exited, in order.
    exited: Vec<u32>,
    /// Processes followed into a profile (`--follow-children`).
    children: u64,
    /// Records too short to be samples.
    bad_records: u64,
    /// Records of processes in no profile (the filter forgot them when they exited).
    unrouted: u64,
    /// Processes in the kernel's filter after the last check for exited ones.
    filter_entries: usize,
}

/// The run's profiles and which process's samples go to which.
struct Feeds {
    list: Vec<Feed>,
    /// Process -> index in `list`.
    route: HashMap<u32, usize>,
    run: RunState,
}

impl Feeds {
    fn new(list: Vec<Feed>) -> Feeds {
        let mut route = HashMap::new();
        for (i, f) in list.iter().enumerate() {
            for m in &f.maps {
                route.insert(m.pid(), i);
            }
        }
        Feeds { list, route, run: RunState::default() }
    }

    /// One record of the eBPF ring, into the profile of its process.
    fn sample(&mut self, bytes: &[u8], bpf: &mut SampleBpf) {
        // The pid alone (the profile's feed parses the whole record).
        let off = std::mem::offset_of!(SampleRecord, pid);
        let pid = match bytes.get(off..off + 4) {
            Some(b) if bytes.len() >= etm_bpf_common::SAMPLE_RECORD_SIZE => u32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
            _ => {
                self.run.bad_records += 1;
                return;
            }
        };
        let i = match self.route.get(&pid) {
            Some(&i) => i,
            None => match self.adopt(pid, bpf) {
                Some(i) => i,
                None => {
                    self.run.unrouted += 1;
                    return;
                }
            },
        };
        self.list[i].sample(bytes);
    }

    /// The first record of a process the fork program added: it joins the profile of the
    /// target it descends from (the filter map's value), with its maps read now.
    fn adopt(&mut self, pid: u32, bpf: &mut SampleBpf) -> Option<usize> {
        let root = bpf.tgid_root(pid)?;
        let &i = self.route.get(&root)?;
        let feed = &mut self.list[i];
        feed.maps.push(MapsTracker::new(pid));
        if let Err(e) = feed.reload_maps_of(feed.maps.len() - 1) {
            log::debug!("maps of the new process {pid}: {e}");
        }
        self.route.insert(pid, i);
        self.run.children += 1;
        log::info!("following process {pid} ({}), of target {root}", cmdline(pid).join(" "));
        Some(i)
    }

    /// Once a second: processes that exited leave the kernel's filter (their numbers may be
    /// reused) and targets that exited are noted. `held` is the launched command's state.
    /// Returns the targets still running.
    fn reap(&mut self, info: &RunInfo, bpf: &mut SampleBpf, held_running: Option<bool>) -> usize {
        let gone = |p: u32| if p == info.pid && held_running.is_some() { held_running == Some(false) } else { !alive(p) };
        for f in &mut self.list {
            for m in &f.maps {
                let p = m.pid();
                if !f.exited.contains(&p) && gone(p) {
                    f.exited.push(p);
                    if info.pids.contains(&p) {
                        self.run.exited.push(p);
                        log::info!("target {p} exited");
                    }
                }
            }
        }
        if info.follow || info.pids.len() > 1 {
            let kept = bpf.kept_tgids();
            self.run.filter_entries = kept.len();
            for (p, _) in kept {
                if gone(p) {
                    bpf.remove_tgid(p);
                    self.run.filter_entries -= 1;
                }
            }
        }
        info.pids.iter().filter(|p| !self.run.exited.contains(p)).count()
    }
}

/// Ends the collection: ETM groups disabled and drained, recordings finished, pending samples
/// joined. Returns why the run stopped.
fn feed_finish(feed: &mut Feed) -> anyhow::Result<StopReason> {
    if let Some(etm) = feed.etm.take() {
        for (cpu, st) in etm.stats() {
            log::info!("ETM buffer of cpu {cpu}: {st:?}");
        }
        log::info!("ETM collection: {:?}", etm.collect_stats());
        let (_, counts) = etm.finish(Some(&mut feed.engine)).context("finishing the ETM collection")?;
        feed.etm_counts = Some(counts);
    }
    if let Some(r) = feed.recorder.take() {
        if r.errors > 0 {
            log::warn!("{} recording errors", r.errors);
        }
        r.finish().context("finishing the recording")?;
    }
    feed.engine.pipeline_mut().finish();
    Ok(feed.stop.unwrap_or(StopReason::Signal))
}

/// What [`open_events`] would pick without `--branches etm`, probed on this thread (no CPU-wide
/// privileges needed): the event and the branch source (`lbr` or `none`).
pub(crate) fn probe_events() -> (SampleEvent, &'static str) {
    use crate::live::perf_event::{perf_event_open, sampling_attr};
    if perf_event_open(&sampling_attr(SampleEvent::Cycles, 999, true), 0, -1).is_ok() {
        (SampleEvent::Cycles, "lbr")
    } else if perf_event_open(&sampling_attr(SampleEvent::Cycles, 999, false), 0, -1).is_ok() {
        (SampleEvent::Cycles, "none")
    } else {
        (SampleEvent::CpuClock, "none")
    }
}

/// Opens the sampling events: cycles with branch records (per target thread or per CPU, as
/// `scope` says) when asked for and possible, else cycles, else cpu-clock, on all CPUs.
/// Returns the event, the fds, the branch source and, for branch events, the line saying the
/// scope, why, and what it costs.
#[allow(clippy::type_complexity)]
fn open_events(
    freq: u64,
    want: Branches,
    cpus: &[u32],
    pids: &[u32],
    scope: &etm_perf::host::ScopeChoice,
) -> anyhow::Result<(SampleEvent, Vec<std::os::fd::OwnedFd>, &'static str, Option<String>)> {
    if want != Branches::None {
        let opened = match scope.scope {
            BranchScope::PerThread => pids.iter().try_fold(Vec::new(), |mut all, &pid| {
                all.extend(open_per_thread(SampleEvent::Cycles, freq, true, pid)?);
                Ok::<_, std::io::Error>(all)
            }),
            BranchScope::CpuWide => open_per_cpu(SampleEvent::Cycles, freq, true, cpus),
        };
        match opened {
            Ok(fds) => {
                let line = match scope.scope {
                    BranchScope::PerThread => format!(
                        "per-thread on {} threads of pid {} (inherited by new threads and processes; only they record branches and pay the wipe at their switches): {}",
                        fds.len(),
                        pids.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
                        scope.reason
                    ),
                    BranchScope::CpuWide => format!(
                        "CPU-wide on {} CPUs (every task records branches and pays the wipe at every switch){}: {}",
                        cpus.len(),
                        if scope.null_pmu_ctx_risk {
                            "; this kernel can fault in armv8pmu_sched_task"
                        } else if scope.stale_branch_risk {
                            "; first samples after a switch may carry another task's branches"
                        } else {
                            ""
                        },
                        scope.reason
                    ),
                };
                return Ok((SampleEvent::Cycles, fds, "lbr", Some(line)));
            }
            Err(e) if want == Branches::Lbr => {
                bail!("--branches lbr: branch sampling (LBR/BRBE) is unavailable here: {e}")
            }
            Err(e) => log::info!("no LBR branch sampling ({e}); stack-only"),
        }
    }
    match open_per_cpu(SampleEvent::Cycles, freq, false, cpus) {
        Ok(fds) => return Ok((SampleEvent::Cycles, fds, "none", None)),
        Err(e) => log::info!("no hardware cycles event ({e}); using cpu-clock"),
    }
    let fds = open_per_cpu(SampleEvent::CpuClock, freq, false, cpus).context(
        "perf events are unavailable: cannot open the cpu-clock sampling event \
         (check /proc/sys/kernel/perf_event_paranoid and that the kernel has perf events)",
    )?;
    Ok((SampleEvent::CpuClock, fds, "none", None))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopReason {
    Duration,
    Signal,
    TargetExited,
    UserQuit,
}

impl StopReason {
    fn text(self) -> &'static str {
        match self {
            StopReason::Duration => "duration reached",
            StopReason::Signal => "signal received",
            StopReason::TargetExited => "target exited",
            StopReason::UserQuit => "quit",
        }
    }
}

async fn run_loop(
    args: &RunArgs,
    info: &RunInfo,
    bpf: &mut SampleBpf,
    feeds: &mut Feeds,
    mut held: Option<&mut Held>,
) -> anyhow::Result<()> {
    let ring = bpf.take_ring()?;
    // SAFETY: the RingBuf owns its map fd, which stays open and unchanged for as long as the
    // AsyncFd owns the RingBuf.
    let mut ring = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
        .map_err(|e| anyhow::anyhow!("register the ring buffer with tokio: {e}"))?;
    let mut sigint = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut dump_tick = tokio::time::interval(Duration::from_secs_f64(args.dump_every));
    dump_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    dump_tick.tick().await;
    // The eBPF side wakes us only when a lot is pending; drain at least this often (and the
    // ETM buffers on the same tick, as often as the plan harvests).
    let drain_every = feeds.list[0].etm.as_ref().map_or(DRAIN_INTERVAL, |e| e.drain_interval(DRAIN_INTERVAL));
    let mut drain_tick = tokio::time::interval(drain_every);
    drain_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let deadline = tokio::time::sleep(Duration::from_secs_f64(args.duration.unwrap_or(1e9)));
    tokio::pin!(deadline);

    let mut tui = None;
    let (key_tx, mut key_rx) = tokio::sync::mpsc::unbounded_channel::<Key>();
    if !args.headless {
        tui = Some(crate::tui::Tui::enter().context("cannot set up the terminal")?);
        // crossterm's reader blocks: run it on its own thread, feeding the loop.
        std::thread::spawn(move || {
            while let Ok(ev) = crossterm::event::read() {
                if let crossterm::event::Event::Key(k) = ev
                    && let Some(key) = crate::tui::map_key(&k)
                    && key_tx.send(key).is_err()
                {
                    break;
                }
            }
        });
    }
    let mut app = App::default();
    let started = Instant::now();
    let mut last = (Instant::now(), 0u64);
    let mut counters = BpfCounters::default();
    let mut dump_error: Option<anyhow::Error> = None;
    for f in &mut feeds.list {
        f.dumper = Some(crate::dumper::Dumper::start()?);
    }
    let mut signalled = false;

    let reason = loop {
        tokio::select! {
            guard = ring.readable_mut() => {
                let mut guard = guard.context("wait for the ring buffer")?;
                drain(guard.get_inner_mut(), feeds, bpf);
                guard.clear_ready();
            }
            _ = drain_tick.tick() => {
                drain(ring.get_mut(), feeds, bpf);
                feeds.list[0].drain_etm();
                if let Some(h) = held.as_deref_mut()
                    && h.try_wait().is_some()
                {
                    break StopReason::TargetExited;
                }
            }
            _ = tick.tick() => {
                counters = bpf.counters().unwrap_or(counters);
                let held_running = held.as_deref_mut().map(|h| h.try_wait().is_none());
                let running = feeds.reap(info, bpf, held_running);
                for f in &mut feeds.list {
                    if let Err(e) = f.reload_maps() {
                        log::debug!("maps: {e}");
                    }
                }
                let now = Instant::now();
                let samples: u64 = feeds.list.iter().map(|f| f.engine.pipeline().trie().0.total_samples()).sum();
                let contexts: usize = feeds.list.iter().map(|f| f.engine.pipeline().trie().0.len() - 1).sum();
                let rate = (samples - last.1) as f64 / now.duration_since(last.0).as_secs_f64();
                last = (now, samples);
                let state = target_state(info, &feeds.run, running);
                if let Some(t) = tui.as_mut() {
                    app.set_snapshot(snapshot(info, feeds, &counters, rate, &state));
                    t.draw(&app)?;
                } else {
                    let d = feeds.list[0].engine.depth;
                    let per_pid = if info.per_pid {
                        let each: Vec<String> = feeds.list.iter()
                            .map(|f| format!("{} {}", f.pid, f.engine.pipeline().trie().0.total_samples()))
                            .collect();
                        format!(" (per pid: {})", each.join(", "))
                    } else {
                        String::new()
                    };
                    // writeln, not println: a closed stdout must not panic.
                    let _ = writeln!(
                        info.out(),
                        "etm-bpf: {:>4.0}s samples {}{per_pid} ({:.0}/s) dropped {} contexts {} depth mean {:.1} shallow {:.0}% target {state}",
                        started.elapsed().as_secs_f64(), samples, rate, counters.dropped(),
                        contexts, d.mean(), 100.0 * d.shallow_fraction(),
                    );
                }
                if running == 0 {
                    break StopReason::TargetExited;
                }
            }
            _ = dump_tick.tick(), if args.dump_dir.is_some() => {
                let dir = args.dump_dir.as_deref().expect("checked");
                // The snapshots are taken here; the dump threads write them while draining goes on.
                for f in &mut feeds.list {
                    let mut dumper = f.dumper.take().expect("started above");
                    let job = dump_job(dir, info, f, &feeds.run, &counters, false, (dumper.written, dumper.skipped));
                    let r = dumper.submit(job);
                    f.dumper = Some(dumper);
                    if let Err(e) = r {
                        log::error!("dump failed: {e:#}");
                        dump_error = Some(e);
                        break;
                    }
                }
                if dump_error.is_some() {
                    break StopReason::Signal;
                }
            }
            Some(key) = key_rx.recv() => {
                app.on_key(key);
                if app.quit {
                    break StopReason::UserQuit;
                }
                if let Some(t) = tui.as_mut() {
                    t.draw(&app)?;
                }
            }
            _ = sigint.recv() => {
                // A launched command gets the signal and is profiled until it exits; a
                // second signal stops at once. (Ctrl-C from the terminal reached it already.)
                match held.as_deref_mut() {
                    Some(h) if !signalled => {
                        signalled = true;
                        if !terminal_foreground() {
                            h.signal(libc::SIGINT);
                        }
                    }
                    _ => break StopReason::Signal,
                }
            }
            _ = sigterm.recv() => match held.as_deref_mut() {
                Some(h) if !signalled => {
                    signalled = true;
                    h.signal(libc::SIGTERM);
                }
                _ => break StopReason::Signal,
            },
            _ = &mut deadline, if args.duration.is_some() => break StopReason::Duration,
        }
    };
    drop(tui);
    if let Some(e) = dump_error {
        return Err(e);
    }
    // Stop sampling, then drain what is left in the ring.
    bpf.disable_all();
    drain(ring.get_mut(), feeds, bpf);
    for f in &mut feeds.list {
        f.stop = Some(reason);
    }
    Ok(())
}

/// The status line's target state: `running` or `exited` for one target; with several, how
/// many run and which exited.
fn target_state(info: &RunInfo, run: &RunState, running: usize) -> String {
    let mut s = if info.pids.len() == 1 {
        (if running == 1 { "running" } else { "exited" }).to_string()
    } else {
        format!("{running} of {} running", info.pids.len())
    };
    if !run.exited.is_empty() && info.pids.len() > 1 {
        let gone: Vec<String> = run.exited.iter().map(u32::to_string).collect();
        s.push_str(&format!(", exited: {}", gone.join(",")));
    }
    if info.follow {
        s.push_str(&format!(", children followed {}", run.children));
    }
    s
}

/// How often the ring buffer is drained without a wake-up from the kernel side.
const DRAIN_INTERVAL: Duration = Duration::from_millis(100);

/// Feeds every pending ring-buffer record into the pipeline of its profile.
fn drain(rb: &mut aya::maps::RingBuf<aya::maps::MapData>, feeds: &mut Feeds, bpf: &mut SampleBpf) {
    while let Some(item) = rb.next() {
        feeds.sample(&item, bpf);
    }
}

/// Bits of a live-view row's node id that say which profile it is from (per-pid runs).
const ROW_PROFILE_SHIFT: u32 = 26;

fn snapshot(info: &RunInfo, feeds: &Feeds, k: &BpfCounters, rate: f64, state: &str) -> Snapshot {
    let feed = &feeds.list[0];
    let d = feed.engine.depth;
    let (trie, frames) = feed.engine.pipeline().trie();
    let st = feed.engine.pipeline().stats();
    // Several profiles: their rows together, each under a `[pid N]` root frame.
    let (total, rows) = if feeds.list.len() == 1 {
        (trie.total_samples(), rows_from_trie(trie, frames, 200))
    } else {
        let mut rows = Vec::new();
        let mut total = 0;
        for (i, f) in feeds.list.iter().enumerate() {
            let (t, fr) = f.engine.pipeline().trie();
            total += t.total_samples();
            rows.extend(rows_from_trie(t, fr, 200).into_iter().map(|mut r| {
                r.node |= (i as u32) << ROW_PROFILE_SHIFT;
                r.frames.push(format!("[pid {}]", f.pid));
                r
            }));
        }
        rows.sort_by_key(|r| std::cmp::Reverse((r.self_count, r.total_count)));
        (total, rows)
    };
    let pids = if info.pids.len() == 1 {
        info.pid.to_string()
    } else {
        // Each target with its program's name.
        let name = |p: u32| cmdline(p).first().map(|c| c.rsplit('/').next().unwrap_or(c).to_string()).unwrap_or_default();
        info.pids.iter().map(|&p| format!("{p} {}", name(p))).collect::<Vec<_>>().join(", ")
    };
    Snapshot {
        total,
        rows,
        instr: crate::engine::exact_figures(feed.engine.pipeline()),
        status: Status {
            target: match &info.output {
                Some(o) => format!("pid {pids} ({}) output: {}", info.command.join(" "), o.display()),
                None if info.pids.len() > 1 => format!("pids {pids}"),
                None => format!("pid {pids} ({})", info.command.join(" ")),
            },
            target_state: state.to_owned(),
            samples_per_s: rate,
            samples: total,
            dropped: k.dropped() + st.join.rejected.total(),
            event: format!("{} @ {} Hz", info.event, info.freq),
            branches: info.branches.to_owned(),
            depth_mean: d.mean(),
            shallow: d.shallow_fraction(),
            nodes: trie.len() - 1,
            folded: trie.stats().folded_samples,
            truncated: st.stacks_truncated,
        },
    }
}

fn print_summary(
    reason: StopReason,
    info: &RunInfo,
    feed: &Feed,
    run: &RunState,
    k: &BpfCounters,
    dump_dir: Option<&Path>,
    record: Option<&Path>,
) {
    let (trie, frames) = feed.engine.pipeline().trie();
    let total = trie.total_samples();
    let mut out = info.out();
    let pids = if info.per_pid { vec![feed.pid] } else { info.pids.clone() };
    let _ = writeln!(
        out,
        "etm-bpf: stopped ({}): {} samples of pid {}{}, dropped {} (ring full {}, stack errors {})",
        reason.text(),
        total,
        pids.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
        if info.follow { format!(" and {} followed processes", feed.maps.len() - pids.len()) } else { String::new() },
        k.dropped(),
        k.ring_full,
        k.stack_err
    );
    let exited: Vec<String> = run.exited.iter().filter(|p| pids.contains(p)).map(u32::to_string).collect();
    if info.pids.len() > 1 && !exited.is_empty() {
        let _ = writeln!(out, "etm-bpf: pid {} exited during the run", exited.join(","));
    }
    if info.branches != "none" {
        let st = feed.engine.pipeline().stats();
        let _ = writeln!(
            out,
            "branches {}: samples with branches {} (joined {}), rejected {}",
            info.branches,
            feed.engine.branch_samples + st.join.joined,
            st.join.joined,
            st.join.rejected.total()
        );
        if info.branches == "etm" {
            let _ = writeln!(
                out,
                "synthesized samples {}, rejected {}, windows stopped early {}",
                st.join.synthesized,
                st.join.synth_rejected.total(),
                st.join.synth_stops.total()
            );
        }
        if info.branches == "lbr" {
            let _ = writeln!(
                out,
                "branch stacks: empty {} (kernel: {}), wrong-path entries dropped {}, tx aborts {}, read errors {}",
                st.lbr_empty,
                k.branch_empty,
                st.lbr_wrong_path,
                st.lbr_tx_abort,
                k.branch_err + k.branch_enoent
            );
        }
        if let Some(w) = st.branch_warning() {
            log::warn!("{w}");
            let _ = writeln!(out, "warning: {w}");
        }
    }
    let rows = rows_from_trie(trie, frames, 10);
    let _ = writeln!(out, "top contexts by self samples (leaf <- callers):");
    for r in rows.iter().filter(|r| r.self_count > 0).take(10) {
        let _ = writeln!(
            out,
            "  {:5.1}% {:>8}  {}",
            100.0 * r.self_count as f64 / total.max(1) as f64,
            r.self_count,
            r.frames.join(" <- ")
        );
    }
    if let Some(d) = dump_dir {
        let _ = writeln!(out, "profile written to {}", profile_dir(d, info, feed).display());
    }
    if let Some(d) = record {
        let _ = writeln!(out, "session recorded to {} (etm-bpf replay {0})", d.display());
    }
}

fn unix_ns(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC) from a system time.
fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z", sod / 3600, sod % 3600 / 60, sod % 60, d.subsec_millis())
}

/// Where a profile's dump goes: the dump directory, or its `pid-N/` with one profile per
/// target.
fn profile_dir(dir: &Path, info: &RunInfo, feed: &Feed) -> PathBuf {
    if info.per_pid { dir.join(format!("pid-{}", feed.pid)) } else { dir.to_path_buf() }
}

/// The dump of the profile so far: a snapshot for the dump thread and its manifest.
fn dump_job(
    dir: &Path,
    info: &RunInfo,
    feed: &Feed,
    run: &RunState,
    k: &BpfCounters,
    final_dump: bool,
    dumps: (u64, u64),
) -> DumpJob {
    let e = &feed.engine;
    let targets: Vec<u32> = if info.per_pid { vec![feed.pid] } else { info.pids.clone() };
    let processes: Vec<serde_json::Value> = feed
        .maps
        .iter()
        .map(|m| {
            serde_json::json!({
                "pid": m.pid(),
                "target": targets.contains(&m.pid()),
                "exited": feed.exited.contains(&m.pid()),
            })
        })
        .collect();
    let end = SystemTime::now();
    let meta = DumpMeta {
        period_ns: (1_000_000_000 / info.freq) as i64,
        time_nanos: unix_ns(info.start),
        duration_nanos: unix_ns(end) - unix_ns(info.start),
        comment: format!(
            "etm-bpf run --pid {} ({})",
            targets.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
            info.event
        ),
    };
    // Per-binary PGO dumps only when samples carry branch records (LBR/BRBE or ETM). The copy
    // is taken on the drain loop: its time is in the manifest.
    let t0 = std::time::Instant::now();
    let snapshot = e.snapshot();
    let snapshot_us = t0.elapsed().as_micros() as u64;
    let (trie, _) = e.pipeline().trie();
    let ts = trie.stats();
    let d = e.depth;
    let binaries = e.binaries();
    let load = e.load_times();
    let mut manifest = serde_json::json!({
        "tool": "etm-bpf",
        "version": env!("CARGO_PKG_VERSION"),
        "final": final_dump,
        "pid": feed.pid,
        "command": feed.command,
        "pids": targets,
        "processes": processes,
        "run": {
            "targets": info.pids,
            "per_pid": info.per_pid,
            "merge": info.merge,
            "follow_children": info.follow,
            "targets_exited": run.exited,
            "processes_followed": run.children,
            "forks_followed_kernel": k.forks_followed,
            "forks_lost_filter_full": k.forks_lost,
            "records_unrouted": run.unrouted,
            "filter_entries": run.filter_entries,
            "bad_records": run.bad_records,
        },
        "binaries": binaries.iter().zip(&load).map(|(b, l)| serde_json::json!({
            "path": b.path,
            "build_id": b.build_id_hex(),
            "load_addresses": b.load_addresses.iter().map(|a| format!("{a:#x}")).collect::<Vec<_>>(),
            "load": l.json(),
        })).collect::<Vec<_>>(),
        "samples": trie.total_samples(),
        "dropped": k.dropped(),
        "counts": {
            "samples_in_profile": trie.total_samples(),
            "kernel_samples_written": k.samples,
            "dropped_ring_full": k.ring_full,
            "dropped_ring_busy": k.ring_busy,
            "dropped_stack_error": k.stack_err,
            "branch_read_errors": k.branch_err,
            "branch_read_enoent": k.branch_enoent,
            "branch_read_empty": k.branch_empty,
            "records_received": d.samples + feed.bad_records + feed.foreign + feed.empty,
            "bad_records": feed.bad_records + feed.empty,
            "foreign_records": feed.foreign,
            "unmapped_frames": e.unknown_frames(),
            "maps_reloads": feed.maps.iter().map(|m| m.changes).sum::<u64>(),
            "images_changed_on_disk": e.pipeline().code().images_changed(),
            "contexts": ts.nodes - 1,
            "folded_samples": ts.folded_samples,
            "trie_compactions": ts.compactions,
            "stack_depth_mean": d.mean(),
            "stack_depth_max": d.max,
            "shallow_stack_fraction": d.shallow_fraction(),
            "dumps_written": dumps.0,
            "dumps_skipped_busy": dumps.1,
            "dump_snapshot_us": snapshot_us,
            "unwind": unwind_json(e, k),
        },
        "pipeline": pipeline_json(e.pipeline()),
        "start_time": rfc3339(info.start),
        "end_time": rfc3339(end),
        "event": info.event,
        "frequency_hz": info.freq,
        "branch_source": info.branches,
        "clock": "CLOCK_MONOTONIC (bpf_ktime_get_ns)",
    });
    if let Some(w) = &info.window_line {
        let key = if info.branches == "etm" { "etm_window" } else { "branch_events" };
        manifest[key] = serde_json::json!(w);
    }
    if let Some(c) = feed.etm.as_ref().map(EtmLive::counts).or_else(|| feed.etm_counts.clone()) {
        manifest["counts"]["etm"] = c;
    }
    DumpJob { dir: profile_dir(dir, info, feed), snapshot, meta, manifest }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ring holds a quarter second of records at the sampling rate: 16 KiB copies at
    /// 999 Hz on 2 CPUs need 16 MiB; frame-pointer records keep the 4 MiB default; the
    /// bound holds for many CPUs.
    #[test]
    fn ring_fits_a_quarter_second_of_records() {
        let rec = etm_bpf_common::SAMPLE_RECORD_SIZE + etm_bpf_common::USER_REGS_SIZE + 16384;
        assert_eq!(ring_bytes(rec, 999, 2), 16 << 20);
        assert!(u64::from(ring_bytes(rec, 999, 2)) >= (rec as u64 + 8) * 999 * 2 / 4);
        assert_eq!(ring_bytes(etm_bpf_common::SAMPLE_RECORD_SIZE, 999, 2), etm_bpf_common::RING_BYTES);
        assert_eq!(ring_bytes(rec + 16384, 100_000, 4096), 256 << 20);
        assert!(ring_bytes(rec, 1, 0).is_power_of_two());
    }

    /// The RFC 3339 formatter agrees with known instants.
    #[test]
    fn formats_utc_times() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_709_210_096_123); // 2024-02-29T12:34:56.123Z
        assert_eq!(rfc3339(t), "2024-02-29T12:34:56.123Z");
    }

    /// A record whose branch read returned 0 entries stays a branch sample with an empty
    /// stack (not a stack-only one); entries keep their flag words; no read means `None`.
    #[test]
    fn ring_records_keep_empty_branch_stacks_and_flags() {
        let mut bytes = vec![0u8; etm_bpf_common::SAMPLE_RECORD_SIZE];
        let mut rec = SampleRecord::from_bytes(&bytes).unwrap();
        let mut s = PauseSample::default();
        let mut spare = None;
        fill_branches(&rec, &mut s, &mut spare);
        assert_eq!(s.branches, None);
        rec.flags = REC_HAS_BRANCHES;
        fill_branches(&rec, &mut s, &mut spare);
        assert_eq!(s.branches, Some(vec![]));
        rec.branch_count = 1;
        rec.branches[0] = etm_bpf_common::BranchEntry { from: 0x10, to: 0x20, flags: 1 << 24 };
        fill_branches(&rec, &mut s, &mut spare);
        assert_eq!(s.branches, Some(vec![BranchPair { from: 0x10, to: 0x20 }]));
        assert_eq!(s.branch_flags, vec![1 << 24]);
        bytes.clear();
    }

    /// Our own process is alive and a pid that cannot exist is not.
    #[test]
    fn process_state() {
        assert!(alive(std::process::id()));
        assert!(!alive(u32::MAX - 1));
    }
}
