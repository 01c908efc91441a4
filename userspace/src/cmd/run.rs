//! `etm-bpf run`: live call-stack profiling of one process.
//!
//! Opens a sampling perf event on every CPU (hardware cycles if the PMU has them, else the
//! `cpu-clock` software event), attaches the eBPF sampler (which keeps samples of the target's
//! threads only, so threads created later are covered), drains its ring buffer with tokio,
//! resolves and symbolizes the stacks into a calling-context trie, and shows the live view
//! (or a one-line summary per second with `--headless`), dumping the profile periodically.

use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use etm_bpf_common::{FLAG_READ_BRANCHES, SampleRecord};
use tokio::io::unix::AsyncFd;
use tokio::signal::unix::{SignalKind, signal};

use crate::dump::{check_writable_dir, write_atomic};
use crate::live::bpf::{BpfCounters, SampleBpf};
use crate::live::collector::Collector;
use crate::live::perf_event::{SampleEvent, open_per_cpu};
use crate::tui::app::{App, Key, Snapshot, Status, rows_from_trie};

/// Where branch records come from.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Branches {
    /// LBR when the PMU has it, else none.
    Auto,
    /// Stack-only samples.
    None,
    /// Intel LBR / Arm BRBE through perf branch sampling (fails if unavailable).
    Lbr,
}

#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
    sudo etm-bpf run --pid 1234\n  \
    sudo etm-bpf run --pid 1234 --headless --duration 5 --dump-dir out\n\n\
    Needs root (CAP_BPF + CAP_PERFMON, or CAP_SYS_ADMIN). The target should be built with\n\
    frame pointers (-fno-omit-frame-pointer -mno-omit-leaf-frame-pointer).")]
pub struct RunArgs {
    /// Process to profile (all its threads, including ones created later).
    #[arg(long)]
    pub pid: u32,
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
    /// Memory bound of the context trie (number of contexts).
    #[arg(long, default_value_t = 200_000)]
    pub max_contexts: usize,
    /// Log file in live-view mode (default: DUMP_DIR/etm-bpf.log, else /tmp/etm-bpf-PID.log).
    #[arg(long)]
    pub log_file: Option<PathBuf>,
}

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Fails unless this process may load BPF programs and open system-wide perf events.
pub(crate) fn check_privileges() -> anyhow::Result<()> {
    let status = std::fs::read_to_string("/proc/self/status").context("read /proc/self/status")?;
    let caps = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
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
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Everything the dumps and the status line report.
struct RunInfo {
    pid: u32,
    command: Vec<String>,
    event: SampleEvent,
    branches: &'static str,
    freq: u64,
    start: SystemTime,
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
    if !args.headless && !std::io::stdout().is_terminal() {
        bail!("the live view needs a terminal on stdout; use --headless");
    }
    let pid = args.pid;
    if pid == 0 || !alive(pid) {
        bail!("no such process: {pid}");
    }
    if let Some(d) = &args.dump_dir {
        check_writable_dir(d)?;
    }
    check_privileges()?;
    if args.headless {
        crate::logging::init_stderr();
    } else {
        let path = args.log_file.clone().unwrap_or_else(|| match &args.dump_dir {
            Some(d) => d.join("etm-bpf.log"),
            None => PathBuf::from(format!("/tmp/etm-bpf-{pid}.log")),
        });
        crate::logging::init_file(&path)?;
    }

    let command = cmdline(pid);
    let mut collector = Collector::new(pid, args.max_contexts);
    if let Err(e) = collector.reload_maps() {
        if !alive(pid) {
            bail!("process {pid} exited during start-up");
        }
        return Err(e).with_context(|| format!("cannot read /proc/{pid}/maps"));
    }

    let cpus = aya::util::online_cpus()
        .map_err(|(what, e)| anyhow::anyhow!("cannot list online CPUs ({what}): {e}"))?;
    let (event, fds, branches) = open_events(args.freq, args.branches, &cpus)?;
    let flags = if branches == "lbr" { FLAG_READ_BRANCHES } else { 0 };
    let mut bpf = SampleBpf::load(pid, flags)
        .context("BPF is unavailable (kernel without BPF, lockdown, or missing privileges)")?;
    for fd in fds {
        bpf.attach_perf_fd(fd)
            .context("cannot attach the eBPF program to the perf event")?;
    }
    if !alive(pid) {
        bail!("process {pid} exited during start-up");
    }
    log::info!(
        "profiling pid {pid} ({}) with {} at {} Hz on {} CPUs, branches {branches}",
        command.join(" "),
        event.name(),
        args.freq,
        cpus.len()
    );
    let info = RunInfo { pid, command, event, branches, freq: args.freq, start: SystemTime::now() };

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the tokio runtime")?;
    rt.block_on(run_loop(&args, &info, &mut bpf, &mut collector))
}

/// Opens the sampling event on all CPUs: cycles if the PMU has them, else cpu-clock.
fn open_events(
    freq: u64,
    want: Branches,
    cpus: &[u32],
) -> anyhow::Result<(SampleEvent, Vec<std::os::fd::OwnedFd>, &'static str)> {
    if want != Branches::None {
        match open_per_cpu(SampleEvent::Cycles, freq, true, cpus) {
            Ok(fds) => return Ok((SampleEvent::Cycles, fds, "lbr")),
            Err(e) if want == Branches::Lbr => {
                bail!("--branches lbr: branch sampling (LBR/BRBE) is unavailable here: {e}")
            }
            Err(e) => log::info!("no LBR branch sampling ({e}); stack-only"),
        }
    }
    match open_per_cpu(SampleEvent::Cycles, freq, false, cpus) {
        Ok(fds) => return Ok((SampleEvent::Cycles, fds, "none")),
        Err(e) => log::info!("no hardware cycles event ({e}); using cpu-clock"),
    }
    let fds = open_per_cpu(SampleEvent::CpuClock, freq, false, cpus).context(
        "perf events are unavailable: cannot open the cpu-clock sampling event \
         (check /proc/sys/kernel/perf_event_paranoid and that the kernel has perf events)",
    )?;
    Ok((SampleEvent::CpuClock, fds, "none"))
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
    collector: &mut Collector,
) -> anyhow::Result<ExitCode> {
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
    // The eBPF side wakes us only when a lot is pending; drain at least this often.
    let mut drain_tick = tokio::time::interval(DRAIN_INTERVAL);
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
    let mut bad_records = 0u64;
    let mut dump_error: Option<anyhow::Error> = None;

    let reason = loop {
        tokio::select! {
            guard = ring.readable_mut() => {
                let mut guard = guard.context("wait for the ring buffer")?;
                drain(guard.get_inner_mut(), collector, &mut bad_records);
                guard.clear_ready();
            }
            _ = drain_tick.tick() => drain(ring.get_mut(), collector, &mut bad_records),
            _ = tick.tick() => {
                counters = bpf.counters().unwrap_or(counters);
                let target_alive = alive(info.pid);
                if target_alive && let Err(e) = collector.reload_maps() {
                    log::debug!("maps: {e}");
                }
                let now = Instant::now();
                let samples = collector.trie().total_samples();
                let rate = (samples - last.1) as f64 / now.duration_since(last.0).as_secs_f64();
                last = (now, samples);
                let state = if target_alive { "running" } else { "exited" };
                if let Some(t) = tui.as_mut() {
                    app.set_snapshot(snapshot(info, collector, &counters, rate, state));
                    t.draw(&app)?;
                } else {
                    let st = collector.stats();
                    // writeln, not println: a closed stdout must not panic.
                    let _ = writeln!(
                        std::io::stdout(),
                        "etm-bpf: {:>4.0}s samples {} ({:.0}/s) dropped {} contexts {} depth mean {:.1} shallow {:.0}% target {state}",
                        started.elapsed().as_secs_f64(), samples, rate, counters.dropped(),
                        collector.trie().len() - 1, st.depth.mean(), 100.0 * st.depth.shallow_fraction(),
                    );
                }
                if !target_alive {
                    break StopReason::TargetExited;
                }
            }
            _ = dump_tick.tick(), if args.dump_dir.is_some() => {
                let dir = args.dump_dir.as_deref().expect("checked");
                if let Err(e) = write_dumps(dir, info, collector, &counters, bad_records, false) {
                    log::error!("dump failed: {e:#}");
                    dump_error = Some(e);
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
            _ = sigint.recv() => break StopReason::Signal,
            _ = sigterm.recv() => break StopReason::Signal,
            _ = &mut deadline, if args.duration.is_some() => break StopReason::Duration,
        }
    };
    drop(tui);
    if let Some(e) = dump_error {
        return Err(e);
    }

    // Stop sampling, then drain what is left in the ring.
    bpf.disable_all();
    drain(ring.get_mut(), collector, &mut bad_records);
    counters = bpf.counters().unwrap_or(counters);
    if let Some(dir) = &args.dump_dir {
        write_dumps(dir, info, collector, &counters, bad_records, true)?;
    }
    print_summary(reason, info, collector, &counters, args.dump_dir.as_deref());
    Ok(ExitCode::SUCCESS)
}

/// How often the ring buffer is drained without a wake-up from the kernel side.
const DRAIN_INTERVAL: Duration = Duration::from_millis(100);

/// Feeds every pending ring-buffer record to the collector.
fn drain(rb: &mut aya::maps::RingBuf<aya::maps::MapData>, c: &mut Collector, bad: &mut u64) {
    while let Some(item) = rb.next() {
        match SampleRecord::from_bytes(&item) {
            Some(rec) => c.add_sample(rec.pid, rec.stack()),
            None => *bad += 1,
        }
    }
}

fn snapshot(
    info: &RunInfo,
    c: &Collector,
    k: &BpfCounters,
    rate: f64,
    state: &str,
) -> Snapshot {
    let st = c.stats();
    let trie = c.trie();
    Snapshot {
        total: trie.total_samples(),
        rows: rows_from_trie(trie, c.frames(), 200),
        status: Status {
            target: format!("pid {} ({})", info.pid, info.command.join(" ")),
            target_state: state.to_owned(),
            samples_per_s: rate,
            samples: trie.total_samples(),
            dropped: k.dropped(),
            event: format!("{} @ {} Hz", info.event.name(), info.freq),
            branches: info.branches.to_owned(),
            depth_mean: st.depth.mean(),
            shallow: st.depth.shallow_fraction(),
            nodes: trie.len() - 1,
            folded: trie.stats().folded_samples,
        },
    }
}

fn print_summary(
    reason: StopReason,
    info: &RunInfo,
    c: &Collector,
    k: &BpfCounters,
    dump_dir: Option<&Path>,
) {
    let trie = c.trie();
    let total = trie.total_samples();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "etm-bpf: stopped ({}): {} samples of pid {}, dropped {} (ring full {}, stack errors {})",
        reason.text(),
        total,
        info.pid,
        k.dropped(),
        k.ring_full,
        k.stack_err
    );
    let rows = rows_from_trie(trie, c.frames(), 10);
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
        let _ = writeln!(out, "profile written to {}", d.display());
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
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60,
        d.subsec_millis()
    )
}

fn write_dumps(
    dir: &Path,
    info: &RunInfo,
    c: &Collector,
    k: &BpfCounters,
    bad_records: u64,
    final_dump: bool,
) -> anyhow::Result<()> {
    let trie = c.trie();
    let frames = c.frames();
    let binaries = c.space().binaries();
    write_atomic(&dir.join("profile.folded"), |w| {
        etm_stacks::folded::write_folded(trie, frames, w)
    })?;
    let end = SystemTime::now();
    let meta = etm_stacks::pprof::PprofMeta {
        period_ns: (1_000_000_000 / info.freq) as i64,
        time_nanos: unix_ns(info.start),
        duration_nanos: unix_ns(end) - unix_ns(info.start),
        comments: vec![format!("etm-bpf run --pid {} ({})", info.pid, info.event.name())],
    };
    let profile = etm_stacks::pprof::build_profile(trie, frames, binaries, &meta);
    write_atomic(&dir.join("profile.pb.gz"), |w| etm_stacks::pprof::write_pprof_gz(&profile, w))?;
    let st = c.stats();
    let ts = trie.stats();
    let manifest = serde_json::json!({
        "tool": "etm-bpf",
        "version": env!("CARGO_PKG_VERSION"),
        "files": ["profile.folded", "profile.pb.gz"],
        "final": final_dump,
        "pid": info.pid,
        "command": info.command,
        "binaries": binaries.iter().map(|b| serde_json::json!({
            "path": b.path,
            "build_id": b.build_id_hex(),
            "load_addresses": b.load_addresses.iter().map(|a| format!("{a:#x}")).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "samples": trie.total_samples(),
        "dropped": k.dropped(),
        "counts": {
            "samples_in_profile": trie.total_samples(),
            "kernel_samples_written": k.samples,
            "dropped_ring_full": k.ring_full,
            "dropped_stack_error": k.stack_err,
            "branch_read_errors": k.branch_err,
            "branch_read_enoent": k.branch_enoent,
            "records_received": st.records,
            "bad_records": bad_records + st.bad_records,
            "unmapped_frames": st.unmapped_frames,
            "maps_reloads": st.maps_reloads,
            "contexts": ts.nodes - 1,
            "folded_samples": ts.folded_samples,
            "trie_compactions": ts.compactions,
            "stack_depth_mean": st.depth.mean(),
            "stack_depth_max": st.depth.max,
            "shallow_stack_fraction": st.depth.shallow_fraction(),
        },
        "start_time": rfc3339(info.start),
        "end_time": rfc3339(end),
        "event": info.event.name(),
        "frequency_hz": info.freq,
        "branch_source": info.branches,
        "clock": "CLOCK_MONOTONIC (bpf_ktime_get_ns)",
    });
    write_atomic(&dir.join("manifest.json"), |w| {
        serde_json::to_writer_pretty(&mut *w, &manifest)?;
        w.write_all(b"\n")
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The RFC 3339 formatter agrees with known instants.
    #[test]
    fn formats_utc_times() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_709_210_096_123); // 2024-02-29T12:34:56.123Z
        assert_eq!(rfc3339(t), "2024-02-29T12:34:56.123Z");
    }

    /// Our own process is alive and a pid that cannot exist is not.
    #[test]
    fn process_state() {
        assert!(alive(std::process::id()));
        assert!(!alive(u32::MAX - 1));
    }
}
