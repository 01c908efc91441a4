//! Running the driver model ([`crate::hw`]) the way `run` runs the live path: the same collector
//! (`etm_live::collect`) drains the model's rings into the same pipeline
//! (`etm_session::pipeline`), optionally recording every event into a session directory — a
//! session shaped like hardware (several CPUs, processes and migrating threads, switch records
//! and context packets, TRBE raw streams with COLLISION and padding or ETR frames with every
//! CPU's trace ID, throttled gaps) that `etm-bpf replay` reads like a `run --record` one —
//! with the model's ground truth for the target process next to it ([`TRUTH_FILE`]).
//!
//! [`check`] compares joined samples with that truth: the checks of issue 8's "done" line.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use etm_live::collect::{CollectStats, Collector, Groups, Strategy};
use etm_session::pipeline::{Pipeline, PipelineConfig, PipelineStats, TRACE_TIMESTAMPS_NOTE};
use etm_session::session::{
    BranchPair, SessionEvent, SessionMeta, SessionSource, SessionWriter, Sideband, TargetInfo, WindowParams,
};

use crate::SynthError;
use crate::hw::{Loss, Model, ModelConfig, ModelStats, Program, TaskSpec, TruthSample};
use crate::image::CodeImage;
use crate::qemu::{self, QemuOptions};
use crate::testprogs::{self, BuildError, Compiler, PROGRAMS};

/// Ground truth of a model session: one JSON line per pause record of the target.
pub const TRUTH_FILE: &str = "hw_truth.jsonl";

/// The target process of [`tasks`].
pub const TARGET: u32 = 100;

/// A program built and run under qemu-user: file, bytes, code, executed path.
pub struct Built {
    pub file: PathBuf,
    pub bytes: Arc<Vec<u8>>,
    pub image: CodeImage,
    pub pcs: Vec<u64>,
}

/// Builds `loops 3`, `indirect` and `recursion` (gcc) into `dir` and records their paths
/// (at most 3 M instructions each). `BuildError::Missing` when the cross compiler or
/// qemu-user is not installed.
pub fn build_programs(dir: &Path) -> Result<Vec<Built>, BuildError> {
    testprogs::qemu_available()?;
    let mut out = Vec::new();
    for (name, args) in [("loops", vec!["3"]), ("indirect", vec![]), ("recursion", vec![])] {
        let prog = PROGRAMS.iter().find(|p| p.name == name).expect("known test program");
        let bin = testprogs::build(prog, Compiler::Gcc, dir)?;
        let args: Vec<String> = args.into_iter().map(String::from).collect();
        let failed = |e: String| BuildError::Failed { name: name.to_string(), compiler: qemu::QEMU, stderr: e };
        let run = qemu::run(&bin, &args, &QemuOptions { max_insns: 3_000_000, ..Default::default() })
            .map_err(|e| failed(e.to_string()))?;
        let bytes = Arc::new(std::fs::read(&bin).map_err(|e| failed(format!("{}: {e}", bin.display())))?);
        let image = CodeImage::parse(&bytes).map_err(|e| failed(e.to_string()))?;
        out.push(Built { file: bin, bytes, image, pcs: run.pcs });
    }
    Ok(out)
}

/// Target pid 100 with threads 100 and 101 (both running program 0, `loops`), pid 200 with
/// threads 200 and 201 (program 1, `indirect`), pid 300 (program 2, `recursion`): five tasks,
/// three processes.
pub fn tasks() -> Vec<TaskSpec> {
    vec![
        TaskSpec { pid: TARGET, tid: 100, program: 0, start: 0 },
        TaskSpec { pid: TARGET, tid: 101, program: 0, start: 700_000 },
        TaskSpec { pid: 200, tid: 200, program: 1, start: 0 },
        TaskSpec { pid: 200, tid: 201, program: 1, start: 300_000 },
        TaskSpec { pid: 300, tid: 300, program: 2, start: 0 },
    ]
}

/// [`tasks`] scaled to `cpus`: the target gets one thread per four CPUs (at least two), the
/// other two processes as many, so every CPU has work and trace.
pub fn tasks_for(cpus: u32) -> Vec<TaskSpec> {
    let per = (cpus / 4).max(2);
    let mut v = Vec::new();
    for (pid, program) in [(TARGET, 0usize), (200, 1), (300, 2)] {
        for k in 0..per {
            v.push(TaskSpec { pid, tid: pid * 100 + k, program, start: (k as usize * 350_000) % 2_000_000 });
        }
    }
    // The target's main thread is tid = pid.
    v[0].tid = TARGET;
    v
}

/// How to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub strategy: Strategy,
    /// Model time (ns).
    pub duration_ns: u64,
    /// The collector drains every this many ns of model time.
    pub drain_ns: u64,
    /// After every drain, also tell the pipeline the trace is complete up to the newest pause
    /// sample seen (the rule the live driver used before it knew how sinks publish).
    pub complete_by_sample_time: bool,
    /// Record every event the pipeline gets into this session directory (with [`TRUTH_FILE`]).
    pub record: Option<PathBuf>,
    /// The tasks (default [`tasks`]).
    pub tasks: Option<Vec<TaskSpec>>,
}

/// A joined sample: cpu, time, thread, branches (newest first).
pub type Joined = (i32, u64, u32, Vec<BranchPair>);

/// What a run gave.
pub struct Outcome {
    pub truth: Vec<TruthSample>,
    pub joined: Vec<Joined>,
    pub stats: PipelineStats,
    pub model: ModelStats,
    pub collect: CollectStats,
}

/// Runs the model with `programs` (index 0 is the target's) as [`tasks`] for
/// `opts.duration_ns`, draining as `run` does.
pub fn run(progs: &[Built], cfg: ModelConfig, opts: &RunOptions) -> Result<Outcome, SynthError> {
    let programs: Vec<Program> =
        progs.iter().map(|b| Program::new(b.file.to_string_lossy(), b.image.clone(), b.pcs.clone())).collect();
    let depth = cfg.depth;
    let cpus = cfg.cpus;
    let (period, window) = (cfg.resume_period, cfg.pause_period / 2);
    let tasks = opts.tasks.clone().unwrap_or_else(tasks);
    let mut model = Model::new(cfg, programs, &tasks);
    let mut pc = PipelineConfig { cpus: model.cpu_configs(), clock: Some(Model::clock_params()), ..Default::default() };
    pc.join.depth = depth;
    let mut p = Pipeline::new(pc.clone());
    let target = &progs[0];
    let file = target.file.to_string_lossy().into_owned();
    p.add_image(&file, target.bytes.clone());
    let mut writer = match &opts.record {
        Some(dir) => {
            let mut notes = HashMap::new();
            notes.insert("generator".to_string(), format!("etm-synth {} driver model", env!("CARGO_PKG_VERSION")));
            notes.insert("ground_truth".to_string(), TRUTH_FILE.to_string());
            notes.insert("delivery".to_string(), opts.strategy.delivery.name().to_string());
            notes.insert(TRACE_TIMESTAMPS_NOTE.to_string(), pc.trace_timestamps.to_string());
            let meta = SessionMeta {
                source: SessionSource::Synthetic,
                target: TargetInfo { pid: i64::from(TARGET), command: vec![file.clone()] },
                cpus: pc.cpus.clone(),
                clock: pc.clock,
                branch_depth: depth as u32,
                window: WindowParams { mode: "free".into(), unit: "cycles".into(), window, period },
                notes,
                arch: Some(etm_session::session::CodeArch::Aarch64),
                ..Default::default()
            };
            let mut w = SessionWriter::create(dir, meta)?;
            w.add_image(&target.file, None, true)?;
            Some(w)
        }
        None => None,
    };
    let write_err: RefCell<Option<etm_session::session::SessionError>> = RefCell::new(None);
    let mut record = |ev: &SessionEvent<'_>| {
        if let Some(w) = writer.as_mut()
            && let Err(e) = w.write_event(ev)
        {
            write_err.borrow_mut().get_or_insert(e);
        }
    };
    // What the live driver adds from /proc: the target's mappings and its threads' names.
    let t0 = Model::perf_time(0);
    for seg in &target.image.segments {
        let page = seg.vaddr & !0xFFF;
        let len = (seg.vaddr + seg.data.len() as u64 - page + 0xFFF) & !0xFFF;
        let mm = Sideband::Mmap2 {
            pid: TARGET,
            tid: TARGET,
            addr: page,
            len,
            pgoff: seg.file_offset & !0xFFF,
            prot: 5,
            flags: 2,
            filename: file.clone(),
            build_id: None,
            time: t0,
            cpu: None,
        };
        record(&SessionEvent::Sideband(&mm));
        p.push(SessionEvent::Sideband(&mm));
    }
    for t in tasks.iter().filter(|t| t.pid == TARGET) {
        let c = Sideband::Comm { pid: TARGET, tid: t.tid, comm: "loops".into(), exec: false, time: t0, cpu: None };
        record(&SessionEvent::Sideband(&c));
        p.push(SessionEvent::Sideband(&c));
    }
    let joined = Rc::new(RefCell::new(Vec::new()));
    let j = joined.clone();
    p.set_observer(Box::new(move |s| j.borrow_mut().push((s.cpu, s.time, s.tid, s.branches.to_vec()))));
    let mut col = Collector::new(model.streams(), opts.strategy);
    for i in 0..cpus as usize {
        // The model's groups cannot fail to enable.
        let _ = Groups::enable(&mut model, i);
    }
    let newest_sample = Cell::new(0u64);
    let mut sink = |ev: SessionEvent<'_>| {
        if let SessionEvent::Sample(s) = &ev {
            newest_sample.set(newest_sample.get().max(s.time));
        }
        record(&ev);
        p.push(ev)
    };
    let mut t = 0;
    while t < opts.duration_ns {
        t += opts.drain_ns;
        model.run_until(t);
        col.tick(&mut model, t, &mut sink);
        if opts.complete_by_sample_time {
            sink(SessionEvent::Sideband(&Sideband::TraceComplete { cpu: None, time: newest_sample.get() + 1 }));
        }
    }
    let collect = col.stats;
    col.finish(&mut model, &mut sink);
    p.finish();
    let stats = p.stats();
    drop(p);
    if let Some(e) = write_err.into_inner() {
        return Err(e.into());
    }
    if let (Some(w), Some(dir)) = (writer, &opts.record) {
        w.finish()?;
        write_truth(&dir.join(TRUTH_FILE), &model.truth)?;
    }
    let joined = Rc::try_unwrap(joined).map(RefCell::into_inner).unwrap_or_else(|rc| rc.borrow().clone());
    Ok(Outcome { truth: model.truth.clone(), joined, stats, model: model.stats, collect })
}

fn loss_name(l: Loss) -> &'static str {
    match l {
        Loss::NotTraced => "not_traced",
        Loss::TrbeWrap => "trbe_wrap",
        Loss::EtrLost => "etr_lost",
        Loss::AuxFull => "aux_full",
        Loss::Throttled => "throttled",
        Loss::Discontinuity => "discontinuity",
        Loss::EndLost => "end_lost",
    }
}

fn loss_from(s: &str) -> Option<Loss> {
    [Loss::NotTraced, Loss::TrbeWrap, Loss::EtrLost, Loss::AuxFull, Loss::Throttled, Loss::Discontinuity, Loss::EndLost]
        .into_iter()
        .find(|l| loss_name(*l) == s)
}

/// Writes the truth as JSON lines `{cpu, time, tid, complete, loss, branches: [{from, to}]}`.
pub fn write_truth(path: &Path, truth: &[TruthSample]) -> Result<(), SynthError> {
    let io = |source| SynthError::Io { path: path.to_path_buf(), source };
    let mut w = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
    for t in truth {
        let v = serde_json::json!({
            "cpu": t.cpu, "time": t.time, "tid": t.tid, "complete": t.complete,
            "loss": t.loss.map(loss_name),
            "branches": t.branches.iter().map(|b| serde_json::json!({"from": b.from, "to": b.to})).collect::<Vec<_>>(),
        });
        serde_json::to_writer(&mut w, &v).map_err(|e| io(e.into()))?;
        w.write_all(b"\n").map_err(io)?;
    }
    w.flush().map_err(io)
}

/// Reads [`write_truth`]'s file.
pub fn read_truth(path: &Path) -> Result<Vec<TruthSample>, SynthError> {
    let io = |source| SynthError::Io { path: path.to_path_buf(), source };
    let f = std::io::BufReader::new(std::fs::File::open(path).map_err(io)?);
    let bad = |what: &str| io(std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string()));
    let mut out = Vec::new();
    for line in f.lines() {
        let line = line.map_err(io)?;
        let v: serde_json::Value = serde_json::from_str(&line).map_err(|e| io(e.into()))?;
        let u = |k: &str| v[k].as_u64().ok_or_else(|| bad(k));
        let branches = v["branches"]
            .as_array()
            .ok_or_else(|| bad("branches"))?
            .iter()
            .map(|b| {
                Ok(BranchPair {
                    from: b["from"].as_u64().ok_or_else(|| bad("from"))?,
                    to: b["to"].as_u64().ok_or_else(|| bad("to"))?,
                })
            })
            .collect::<Result<Vec<_>, SynthError>>()?;
        out.push(TruthSample {
            cpu: v["cpu"].as_i64().ok_or_else(|| bad("cpu"))? as i32,
            time: u("time")?,
            tid: u("tid")? as u32,
            branches,
            complete: v["complete"].as_bool().ok_or_else(|| bad("complete"))?,
            loss: v["loss"].as_str().and_then(loss_from),
        });
    }
    Ok(out)
}

/// The comparison of joined samples with the truth.
#[derive(Debug, Clone, Default)]
pub struct Check {
    /// Target pause samples.
    pub windows: usize,
    /// Of them, those whose whole window reached the AUX ring and holds branches of the thread.
    pub complete: usize,
    /// Of those, joined.
    pub joined_complete: usize,
    /// Joined samples that are wrong: no such pause, another thread, other branches than the
    /// window's (complete windows), branches not the newest of the window's (incomplete ones).
    pub wrong: Vec<String>,
    /// Incomplete windows by loss.
    pub losses: HashMap<&'static str, usize>,
    /// A few complete windows not joined (cpu, time, tid, branches).
    pub missed: Vec<(i32, u64, u32, usize)>,
}

impl Check {
    /// Joined share of complete windows.
    pub fn share(&self) -> f64 {
        self.joined_complete as f64 / self.complete.max(1) as f64
    }
}

/// Compares `joined` with `truth` (see [`Check`]).
pub fn check(truth: &[TruthSample], joined: &[Joined]) -> Check {
    let by_key: HashMap<(i32, u64), &TruthSample> = truth.iter().map(|t| ((t.cpu, t.time), t)).collect();
    let mut c = Check { windows: truth.len(), ..Default::default() };
    for (cpu, time, tid, brs) in joined {
        let Some(t) = by_key.get(&(*cpu, *time)) else {
            c.wrong.push(format!("joined sample cpu {cpu} at {time} has no truth"));
            continue;
        };
        if *tid != t.tid {
            c.wrong.push(format!("cpu {cpu} at {time}: thread {tid}, truth {}", t.tid));
        } else if t.complete && brs != &t.branches {
            c.wrong
                .push(format!("cpu {cpu} at {time} (tid {tid}): branches {brs:x?} differ from the window's {:x?}", t.branches));
        } else if !t.complete && !t.branches.starts_with(brs) {
            c.wrong.push(format!("cpu {cpu} at {time}: {brs:x?} is not the newest of {:x?}", t.branches));
        }
    }
    let joined_keys: HashSet<(i32, u64)> = joined.iter().map(|j| (j.0, j.1)).collect();
    for t in truth {
        if !t.complete {
            *c.losses.entry(t.loss.map_or("unknown", loss_name)).or_default() += 1;
        } else if !t.branches.is_empty() {
            c.complete += 1;
            if joined_keys.contains(&(t.cpu, t.time)) {
                c.joined_complete += 1;
            } else if c.missed.len() < 5 {
                c.missed.push((t.cpu, t.time, t.tid, t.branches.len()));
            }
        }
    }
    c
}
