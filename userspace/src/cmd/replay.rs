//! `etm-bpf replay DIR`: feed a recorded (`run --record`) or synthetic (`synth`) session through
//! the same [`etm_session::Pipeline`] the live run uses, at full speed or paced by the recorded
//! timestamps, then dump the profile with the same writers. The result depends only on the
//! session's contents and order: a replay is deterministic.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use etm_session::join::{DEFAULT_SYNTH_SAMPLES, RejectReason};
use etm_session::session::SessionReader;
use etm_session::{Pipeline, PipelineConfig, PipelineStats};

use crate::dump::{check_writable_dir, write_atomic};
use crate::engine::{DumpMeta, Engine, pipeline_json, write_profile_files};
use crate::unwind::UnwindMode;

#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
    etm-bpf synth --out /tmp/sess -- ./prog-aarch64 100\n  \
    etm-bpf replay /tmp/sess --headless --dump-dir /tmp/prof\n  \
    etm-bpf replay /tmp/sess --paced            # live view, at the recorded pace")]
pub struct ReplayArgs {
    /// Session directory (session.json, events.jsonl, aux/, images/).
    dir: PathBuf,
    /// Write the profile dumps (per-binary perfscript/unsym/bolt.pa, profile.folded,
    /// profile.pb.gz, manifest.json) into this directory.
    #[arg(long)]
    dump_dir: Option<PathBuf>,
    /// No live view: print a summary with the pipeline counters at the end.
    #[arg(long)]
    headless: bool,
    /// Replay at the pace of the recorded timestamps instead of full speed.
    #[arg(long)]
    paced: bool,
    /// Branch records per sample (default: the session's branch_depth, else 32).
    #[arg(long)]
    depth: Option<usize>,
    /// Keep samples without validating them against the code (leaf after target, calls and
    /// returns vs. the stack).
    #[arg(long)]
    no_validate: bool,
    /// Write every joined sample as a JSON line {cpu,pid,tid,time,stack,branches,synth} to this
    /// file (`synth`: 0 for a pause sample, k for the window's k-th synthesized one back from
    /// the pause).
    #[arg(long)]
    samples_out: Option<PathBuf>,
    /// Print the summary as JSON instead of text (with --headless).
    #[arg(long)]
    json: bool,
    /// After each sample, declare its CPU's trace complete up to the sample's time, as the
    /// live driver does after draining the AUX buffers (joins samples without waiting for the
    /// CPU's next window; needs sessions where a pause's AUX data precedes its sample).
    #[arg(long)]
    watermark: bool,
    /// No exact per-function counts from the trace (as `run --no-exact`).
    #[arg(long)]
    no_exact: bool,
    /// No synthesized samples inside the windows (as `run --no-synth-samples`).
    #[arg(long)]
    no_synth_samples: bool,
    /// Which samples are kept for the `<binary>.perfscript` dumps (as `run --perfscript`).
    #[arg(long, value_enum, default_value_t)]
    perfscript: crate::cmd::Perfscript,
    /// Threads decoding the per-CPU trace streams (each stream on one; the join and the
    /// profile stay on the main thread, the profile is the same with any number): a number,
    /// or `auto` = the smaller of the cores and the session's CPUs. 1 decodes on the main thread.
    #[arg(long, default_value = "1", value_parser = crate::cmd::parse_threads)]
    decode_threads: crate::cmd::Threads,
}

pub fn main(args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let use_tui = !args.headless && std::io::IsTerminal::is_terminal(&std::io::stdout());
    if use_tui {
        crate::logging::init_file(&std::env::temp_dir().join("etm-bpf-replay.log"))?;
    } else {
        crate::logging::init_stderr();
    }
    let mut reader = SessionReader::open(&args.dir).with_context(|| format!("cannot open session {}", args.dir.display()))?;
    if let Some(d) = &args.dump_dir {
        check_writable_dir(d)?;
    }
    let meta = reader.meta().clone();
    let mut cfg = PipelineConfig::from_meta(&meta);
    // The live run's context bound (recorded by `run --record`): same trie, same profile.
    if let Some(n) = meta.notes.get(crate::cmd::run::TRIE_NODES_NOTE).and_then(|n| n.parse().ok()) {
        cfg.trie_nodes = n;
    }
    if let Some(d) = args.depth {
        anyhow::ensure!(d > 0, "--depth must be at least 1");
        cfg.join.depth = d;
    }
    cfg.join.validate = !args.no_validate;
    cfg.exact = !args.no_exact;
    cfg.join.synth_samples = if args.no_synth_samples { 0 } else { DEFAULT_SYNTH_SAMPLES };
    cfg.profile.keep_samples = args.perfscript.keep();
    cfg.decode_threads = args.decode_threads.count(meta.cpus.len());
    // The same engine (pipeline, symbolizer, writers) as `run`.
    let mut engine = Engine::new(cfg, None);
    // Pause records with stack copies unwind as the live run unwound them (before the images
    // are registered, so the unwinder gets their mappings).
    let unwind =
        meta.notes.get(crate::cmd::run::UNWIND_NOTE).and_then(|n| <UnwindMode as clap::ValueEnum>::from_str(n, false).ok());
    if let Some(m) = unwind.filter(|&m| m != UnwindMode::Fp) {
        engine.enable_unwinding(m);
    }

    let mut missing_images = Vec::new();
    for img in &meta.images {
        let path = reader.image_path(img);
        match etm_session::image::ImageBytes::map(&path) {
            Ok(bytes) => engine.add_image(&img.path, &path, bytes),
            Err(e) => {
                log::warn!("code image {} ({}): {e}", img.path, path.display());
                missing_images.push(img.path.clone());
            }
        }
    }

    let samples_out = match &args.samples_out {
        Some(p) => {
            let f = std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))?;
            let w = std::rc::Rc::new(std::cell::RefCell::new(std::io::BufWriter::new(f)));
            let w2 = w.clone();
            engine.pipeline_mut().set_observer(Box::new(move |j| {
                let v = serde_json::json!({
                    "cpu": j.cpu, "pid": j.pid, "tid": j.tid, "time": j.time,
                    "stack": j.stack,
                    "branches": j.branches.iter().map(|b| serde_json::json!({"from": b.from, "to": b.to})).collect::<Vec<_>>(),
                    "synth": j.synth,
                });
                let mut w = w2.borrow_mut();
                let _ = serde_json::to_writer(&mut *w, &v);
                let _ = w.write_all(b"\n");
            }));
            Some(w)
        }
        None => None,
    };

    let mut view = if use_tui { Some(View::new(&meta)?) } else { None };

    let started = Instant::now();
    let mut first_time: Option<u64> = None;
    let mut events = 0u64;
    let mut quit = false;
    while let Some(ev) = reader.next_event().context("reading events.jsonl")? {
        events += 1;
        if args.paced {
            let t = ev.time();
            if t != 0 {
                let t0 = *first_time.get_or_insert(t);
                let due = started + Duration::from_nanos(t.saturating_sub(t0));
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
            }
        }
        let sample_at = match ev {
            etm_session::session::SessionEvent::Sample(s) if args.watermark => Some((s.cpu, s.time)),
            _ => None,
        };
        engine.push(ev);
        if let Some((cpu, t)) = sample_at {
            engine.pipeline_mut().trace_complete_until(Some(cpu), t.saturating_add(1));
        }
        if let Some(v) = view.as_mut()
            && events.is_multiple_of(4096)
            && v.tick(engine.pipeline(), false)?
        {
            quit = true;
            break;
        }
    }
    engine.pipeline_mut().finish();
    let pipeline = engine.pipeline();
    let elapsed = started.elapsed();
    if let Some(w) = &samples_out {
        w.borrow_mut().flush().context("writing --samples-out")?;
    }
    let st = pipeline.stats();
    let rs = reader.stats();

    if let Some(dir) = &args.dump_dir {
        write_dumps(dir, &engine, &args.dir, &rs, elapsed, events)?;
    }
    if let Some(mut v) = view.take()
        && !quit
    {
        // Keep the final view until the user quits.
        while !v.tick(pipeline, true)? {}
    }
    let mut summary = summary_json(&rs, pipeline, elapsed, events, &missing_images);
    summary["unwind"] = crate::engine::unwind_counts(&engine);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print_summary(&args.dir, &st, &rs, pipeline, elapsed, events, &missing_images);
    }
    Ok(ExitCode::SUCCESS)
}

fn rejects(st: &PipelineStats) -> Vec<(&'static str, u64)> {
    RejectReason::ALL.iter().map(|&r| (r.name(), st.rejected().get(r))).filter(|&(_, n)| n > 0).collect()
}

fn summary_json(
    rs: &etm_session::session::ReaderStats,
    p: &Pipeline,
    elapsed: Duration,
    events: u64,
    missing_images: &[String],
) -> serde_json::Value {
    let mut v = pipeline_json(p);
    v["events"] = serde_json::json!(events);
    v["elapsed_s"] = serde_json::json!(elapsed.as_secs_f64());
    v["reader"] = serde_json::json!({
        "lines": rs.lines,
        "bad_lines": rs.bad_lines,
        "aux_short": rs.aux_short,
        "aux_missing": rs.aux_missing,
        "ustack_short": rs.ustack_short,
    });
    v["missing_images"] = serde_json::json!(missing_images);
    v
}

fn print_summary(
    dir: &Path,
    st: &PipelineStats,
    rs: &etm_session::session::ReaderStats,
    p: &Pipeline,
    elapsed: Duration,
    events: u64,
    missing_images: &[String],
) {
    let secs = elapsed.as_secs_f64().max(1e-9);
    println!("replay {}: {events} events in {:.3} s ({:.1} MB/s of AUX)", dir.display(), secs, st.aux_bytes as f64 / secs / 1e6);
    if rs.bad_lines + rs.aux_short + rs.aux_missing > 0 || !missing_images.is_empty() {
        println!(
            "  session:  bad lines {}, short AUX reads {}, missing AUX files {}, missing images {}",
            rs.bad_lines,
            rs.aux_short,
            rs.aux_missing,
            missing_images.len()
        );
    }
    println!(
        "  aux:      records {} bytes {} truncated {} short {} gaps {} partial/collision {} (resets {}) cpu changes {} undecoded {}",
        st.aux_records,
        st.aux_bytes,
        st.aux_truncated,
        st.aux_short,
        st.aux_gaps,
        st.aux_partial_collision,
        st.aux_collision_resets,
        st.aux_cpu_changes,
        st.aux_undecoded
    );
    println!(
        "  decode:   branches {} trace-on {} resets {} errors {} overflows {} no-sync {} no-code {} unknown-id {} foreign {}",
        st.branches,
        st.trace_on,
        st.decoder_resets,
        st.decode_errors,
        st.decode_overflows,
        st.decode_nosync,
        st.decode_nocode,
        st.unknown_trace_id,
        st.decode_foreign
    );
    println!(
        "  join:     samples {} joined {} rejected {} (partial {}, unverified {}, leaf frame missing {}; segments {} unmatched {})",
        st.samples,
        st.join.joined,
        st.join.rejected.total(),
        st.join.partial,
        st.join.unverified,
        st.join.leaf_frame_missing,
        st.join.segments,
        st.join.segments_unmatched
    );
    for (name, n) in rejects(st) {
        println!("    rejected {name}: {n}");
    }
    println!(
        "  synthesized: {} (unverified {}), rejected {}, windows stopped early {}",
        st.join.synthesized,
        st.join.synth_unverified,
        st.join.synth_rejected.total(),
        st.join.synth_stops.total()
    );
    for (r, n) in st.join.synth_rejected.iter() {
        println!("    synthesized rejected {}: {n}", r.name());
    }
    for (r, n) in st.join.synth_stops.iter() {
        println!("    synthesis stopped {}: {n}", r.name());
    }
    println!(
        "  samples:  lbr {} stack-only {} profiled {} (stacks cut at a return address after no call {}); lost records {} (events {})",
        st.lbr_samples, st.stack_only_samples, st.profiled, st.stacks_truncated, st.lost_records, st.lost_events
    );
    if st.lbr_samples > 0 {
        println!(
            "  branch records: empty stacks {} wrong-path dropped {} tx aborts {} partial {} cut {} flags mismatch {}",
            st.lbr_empty, st.lbr_wrong_path, st.lbr_tx_abort, st.lbr_partial_entries, st.lbr_cut_entries, st.lbr_flags_mismatch
        );
    }
    if let Some(w) = st.branch_warning() {
        log::warn!("{w}");
        println!("  warning: {w}");
    }
    let ps = p.profile().stats();
    println!(
        "  profile:  samples {} distinct {} contexts {} folded {} dropped {} unresolved addresses {}",
        ps.samples,
        p.profile().distinct_samples(),
        p.trie().0.len().saturating_sub(1),
        ps.folded,
        ps.dropped,
        ps.unresolved_addresses
    );
}

fn write_dumps(
    dir: &Path,
    e: &Engine,
    session: &Path,
    rs: &etm_session::session::ReaderStats,
    elapsed: Duration,
    events: u64,
) -> anyhow::Result<()> {
    let meta =
        DumpMeta { period_ns: 0, time_nanos: 0, duration_nanos: 0, comment: format!("etm-bpf replay {}", session.display()) };
    let mut files = write_profile_files(dir, e, &meta, true)?;
    files.push("manifest.json".into());
    let mut s = summary_json(rs, e.pipeline(), elapsed, events, &[]);
    s["unwind"] = crate::engine::unwind_counts(e);
    s["tool"] = serde_json::json!("etm-bpf replay");
    s["files"] = serde_json::json!(files);
    s["session"] = serde_json::json!(session.display().to_string());
    s["binaries"] = serde_json::json!(
        e.binaries()
            .iter()
            .map(|b| serde_json::json!({
                "path": b.path,
                "build_id": b.build_id_hex(),
                "load_addresses": b.load_addresses.iter().map(|a| format!("{a:#x}")).collect::<Vec<_>>(),
            }))
            .collect::<Vec<_>>()
    );
    // Wall time is not part of the deterministic result.
    s.as_object_mut().map(|o| o.remove("elapsed_s"));
    write_atomic(&dir.join("manifest.json"), |w| {
        serde_json::to_writer_pretty(&mut *w, &s)?;
        w.write_all(b"\n")
    })?;
    Ok(())
}

/// The live view during a replay (the same view as `run`).
struct View {
    tui: crate::tui::Tui,
    app: crate::tui::app::App,
    target: String,
    last: Instant,
}

impl View {
    fn new(meta: &etm_session::session::SessionMeta) -> anyhow::Result<View> {
        Ok(View {
            tui: crate::tui::Tui::enter().context("cannot set up the terminal")?,
            app: crate::tui::app::App::default(),
            target: format!("{} {}", meta.target.pid, meta.target.command.join(" ")),
            last: Instant::now() - Duration::from_secs(1),
        })
    }

    /// Redraw at most 4 times a second and handle keys; true when the user quit. With
    /// `block`, wait for a key (the replay is over).
    fn tick(&mut self, p: &Pipeline, block: bool) -> anyhow::Result<bool> {
        use crate::tui::app::{Snapshot, Status, rows_from_trie};
        if block || self.last.elapsed() >= Duration::from_millis(250) {
            self.last = Instant::now();
            let (trie, frames) = p.trie();
            let st = p.stats();
            let snap = Snapshot {
                total: trie.total_samples(),
                rows: rows_from_trie(trie, frames, 200),
                instr: crate::engine::exact_figures(p),
                status: Status {
                    target: self.target.clone(),
                    target_state: if block { "replayed (q to quit)".into() } else { "replaying".into() },
                    samples: trie.total_samples(),
                    dropped: st.join.rejected.total(),
                    event: "replay".into(),
                    branches: "etm".into(),
                    nodes: trie.len(),
                    folded: trie.stats().folded_samples,
                    truncated: st.stacks_truncated,
                    ..Default::default()
                },
            };
            self.app.set_snapshot(snap);
            self.tui.draw(&self.app)?;
        }
        let wait = if block { Duration::from_millis(250) } else { Duration::ZERO };
        while crossterm::event::poll(wait)? {
            if let crossterm::event::Event::Key(k) = crossterm::event::read()?
                && let Some(key) = crate::tui::map_key(&k)
            {
                self.app.on_key(key);
                if self.app.quit {
                    return Ok(true);
                }
            }
            if !block {
                break;
            }
        }
        Ok(false)
    }
}

/// `etm-bpf replay SESSION --headless --dump-dir OUT`, as the command line parses it (for
/// tests of recordings).
#[cfg(test)]
pub(crate) fn replay_headless(session: &Path, out: &Path) -> anyhow::Result<ExitCode> {
    #[derive(clap::Parser)]
    struct Replay {
        #[command(flatten)]
        args: ReplayArgs,
    }
    let argv = ["replay".as_ref(), session.as_os_str(), "--headless".as_ref(), "--dump-dir".as_ref(), out.as_os_str()];
    main(<Replay as clap::Parser>::try_parse_from(argv)?.args)
}
