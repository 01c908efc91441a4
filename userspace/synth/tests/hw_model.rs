//! The live collection, end to end, against the driver model (`etm_synth::hw`): real AArch64
//! program paths run as three processes (the target with two threads) on four CPUs, the model
//! fills the data and AUX rings as the kernel and each sink topology would, and the same
//! collector (`etm_live::collect`) and pipeline (`etm_session::Pipeline`) that `run` uses
//! consume them. Every joined sample is compared with the model's ground truth.
//!
//! What must hold, per topology: every joined sample carries exactly its window's branches of
//! its own thread (never another process's or thread's), at least 95% of the target's pause
//! samples whose window reached the AUX ring complete (and holds branches of the thread) are
//! joined, and every other sample is counted by a reason.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use etm_live::collect::{Collector, Delivery, Strategy};
use etm_session::pipeline::{Pipeline, PipelineConfig, PipelineStats};
use etm_session::session::{BranchPair, SessionEvent, Sideband};
use etm_synth::hw::{Model, ModelConfig, Program, TaskSpec, Topology, TruthSample};
use etm_synth::image::CodeImage;
use etm_synth::qemu::{self, QemuOptions};
use etm_synth::testprogs::{self, BuildError, Compiler, PROGRAMS};

const TARGET: u32 = 100;

/// A built test program: file, ELF bytes, code, executed path.
type Built = (String, Arc<Vec<u8>>, CodeImage, Vec<u64>);

/// The programs, built and run once per test binary.
fn programs() -> Option<&'static Vec<Built>> {
    static P: OnceLock<Option<Vec<Built>>> = OnceLock::new();
    P.get_or_init(|| {
        if let Err(e) = testprogs::qemu_available() {
            etm_testutil::skip(e);
            return None;
        }
        let dir = std::env::temp_dir().join(format!("etm-hw-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut out = Vec::new();
        for (name, args) in [("loops", vec!["3"]), ("indirect", vec![]), ("recursion", vec![])] {
            let prog = PROGRAMS.iter().find(|p| p.name == name).unwrap();
            let bin = match testprogs::build(prog, Compiler::Gcc, &dir) {
                Ok(b) => b,
                Err(BuildError::Missing(why)) => {
                    etm_testutil::skip(why);
                    return None;
                }
                Err(e) => panic!("{e}"),
            };
            let args: Vec<String> = args.into_iter().map(String::from).collect();
            let run = qemu::run(&bin, &args, &QemuOptions { max_insns: 3_000_000, ..Default::default() }).unwrap();
            let bytes = Arc::new(std::fs::read(&bin).unwrap());
            let image = CodeImage::parse(&bytes).unwrap();
            out.push((bin.to_string_lossy().into_owned(), bytes, image, run.pcs));
        }
        Some(out)
    })
    .as_ref()
}

/// Target pid 100 with threads 100 and 101 (both running `loops`), pid 200 with threads 200
/// and 201 (`indirect`), pid 300 (`recursion`): five tasks on four CPUs.
fn tasks() -> Vec<TaskSpec> {
    vec![
        TaskSpec { pid: TARGET, tid: 100, program: 0, start: 0 },
        TaskSpec { pid: TARGET, tid: 101, program: 0, start: 700_000 },
        TaskSpec { pid: 200, tid: 200, program: 1, start: 0 },
        TaskSpec { pid: 200, tid: 201, program: 1, start: 300_000 },
        TaskSpec { pid: 300, tid: 300, program: 2, start: 0 },
    ]
}

struct Outcome {
    truth: Vec<TruthSample>,
    joined: Vec<(i32, u64, u32, Vec<BranchPair>)>,
    stats: PipelineStats,
    model: etm_synth::hw::ModelStats,
    collect: etm_live::collect::CollectStats,
}

/// Runs the model for `duration_ns` with the collector draining every `drain_ns`.
fn run(cfg: ModelConfig, strategy: Strategy, duration_ns: u64, drain_ns: u64) -> Option<Outcome> {
    run_with(cfg, strategy, duration_ns, drain_ns, false)
}

/// [`run`]; with `by_sample_time`, after every drain the pipeline is also told that the trace
/// is complete up to the newest pause sample seen, as the live driver used to assume.
fn run_with(cfg: ModelConfig, strategy: Strategy, duration_ns: u64, drain_ns: u64, by_sample_time: bool) -> Option<Outcome> {
    let progs = programs()?;
    let programs: Vec<Program> =
        progs.iter().map(|(file, _, image, pcs)| Program::new(file.clone(), image.clone(), pcs.clone())).collect();
    let depth = cfg.depth;
    let cpus = cfg.cpus;
    let mut model = Model::new(cfg, programs, &tasks());
    let mut pc = PipelineConfig { cpus: model.cpu_configs(), clock: Some(Model::clock_params()), ..Default::default() };
    pc.join.depth = depth;
    let mut p = Pipeline::new(pc);
    // What the live driver adds from /proc: the target's code and mappings, its threads.
    let (file, bytes, image, _) = &progs[0];
    p.add_image(file, bytes.clone());
    let t0 = Model::perf_time(0);
    for seg in &image.segments {
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
        p.push(SessionEvent::Sideband(&mm));
    }
    for tid in [100, 101] {
        let c = Sideband::Comm { pid: TARGET, tid, comm: "loops".into(), exec: false, time: t0, cpu: None };
        p.push(SessionEvent::Sideband(&c));
    }
    let joined = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let j = joined.clone();
    p.set_observer(Box::new(move |s| j.borrow_mut().push((s.cpu, s.time, s.tid, s.branches.to_vec()))));
    let mut col = Collector::new(model.streams(), strategy);
    for i in 0..cpus as usize {
        etm_live::collect::Groups::enable(&mut model, i).unwrap();
    }
    let newest_sample = std::cell::Cell::new(0u64);
    let mut sink = |ev: SessionEvent<'_>| {
        if let SessionEvent::Sample(s) = &ev {
            newest_sample.set(newest_sample.get().max(s.time));
        }
        p.push(ev)
    };
    let mut t = 0;
    while t < duration_ns {
        t += drain_ns;
        model.run_until(t);
        col.tick(&mut model, t, &mut sink);
        if by_sample_time {
            sink(SessionEvent::Sideband(&Sideband::TraceComplete { cpu: None, time: newest_sample.get() + 1 }));
        }
    }
    let collect = col.stats;
    col.finish(&mut model, &mut sink);
    p.finish();
    let stats = p.stats();
    drop(p);
    let joined = std::rc::Rc::try_unwrap(joined).unwrap().into_inner();
    Some(Outcome { truth: model.truth.clone(), joined, stats, model: model.stats, collect })
}

/// The checks every topology must pass (module docs); returns the joined share of complete
/// windows.
fn check(o: &Outcome, label: &str) -> f64 {
    let truth: HashMap<(i32, u64), &TruthSample> = o.truth.iter().map(|t| ((t.cpu, t.time), t)).collect();
    assert!(o.truth.len() >= 200, "{label}: only {} target windows ({:?})", o.truth.len(), o.model);
    for (cpu, time, tid, brs) in &o.joined {
        let t = truth.get(&(*cpu, *time)).unwrap_or_else(|| panic!("{label}: joined sample cpu {cpu} at {time} has no truth"));
        assert_eq!(*tid, t.tid, "{label}: thread");
        if t.complete {
            assert_eq!(brs, &t.branches, "{label}: cpu {cpu} at {time} (tid {tid}): branches differ from the window's");
        } else {
            // A window that lost trace may join with the newest branches only, never others.
            assert!(t.branches.starts_with(brs), "{label}: cpu {cpu} at {time}: {brs:x?} is not the newest of {:x?}", t.branches);
        }
    }
    let complete: Vec<&TruthSample> = o.truth.iter().filter(|t| t.complete && !t.branches.is_empty()).collect();
    let joined: std::collections::HashSet<(i32, u64)> = o.joined.iter().map(|j| (j.0, j.1)).collect();
    let got = complete.iter().filter(|t| joined.contains(&(t.cpu, t.time))).count();
    let share = got as f64 / complete.len().max(1) as f64;
    for t in complete.iter().filter(|t| !joined.contains(&(t.cpu, t.time))).take(5) {
        eprintln!("{label}: not joined: cpu {} at {} tid {} ({} branches)", t.cpu, t.time, t.tid, t.branches.len());
    }
    let mut losses: HashMap<String, usize> = HashMap::new();
    for t in o.truth.iter().filter(|t| !t.complete) {
        *losses.entry(format!("{:?}", t.loss)).or_default() += 1;
    }
    eprintln!("{label}: incomplete windows by loss: {losses:?}");
    let st = &o.stats;
    // Every sample the pipeline received is joined or rejected with a reason.
    assert_eq!(st.join.samples, st.join.joined + st.join.rejected.total(), "{label}: {st:?}");
    assert_eq!(st.join.joined, o.joined.len() as u64);
    let reasons: Vec<String> = st.join.rejected.iter().map(|(r, n)| format!("{} {n}", r.name())).collect();
    eprintln!(
        "{label}: {} target windows, {} complete with branches, {} joined ({:.1}%), rejected: {}; model {:?}; collector {:?}",
        o.truth.len(),
        complete.len(),
        got,
        100.0 * share,
        reasons.join(", "),
        o.model,
        o.collect
    );
    share
}

fn strategy(d: Delivery, harvest_ms: Option<u64>) -> Strategy {
    Strategy { delivery: d, harvest_every_ns: harvest_ms.map(|m| m * 1_000_000) }
}

/// TRBE on every CPU, CPU-wide: windows published at the watermark (COLLISION) and at the
/// harvests; with context IDs.
#[test]
fn trbe_cpu_wide_with_context_ids() {
    let cfg = ModelConfig { topology: Topology::Trbe, ..ModelConfig::default() };
    let Some(o) = run(cfg, strategy(Delivery::Watermark, Some(20)), 60_000_000, 5_000_000) else { return };
    assert!(o.model.trbe_irqs > 0, "the watermark was reached: {:?}", o.model);
    assert!(check(&o, "trbe") >= 0.95);
}

/// Shared ETR (N1 style): nothing published until the harvest, then one formatted record with
/// every CPU's trace in the last CPU's ring.
#[test]
fn shared_etr_harvested() {
    let cfg = ModelConfig { topology: Topology::SharedEtr, etr_bytes: 8 << 20, aux_bytes: 8 << 20, ..ModelConfig::default() };
    let Some(o) = run(cfg, strategy(Delivery::Harvest, Some(10)), 60_000_000, 5_000_000) else { return };
    assert!(o.collect.harvests >= 5, "{:?}", o.collect);
    assert!(check(&o, "shared-etr") >= 0.95);
}

/// Finding 5 of the live-path review: a TRBE publishes at its watermark, not at the pause, so
/// completing samples up to the newest pause record after each drain (the old driver's rule)
/// resolves them before their windows arrive: most are lost as no-window.
#[test]
fn trbe_completing_by_sample_time_loses_windows() {
    let cfg = ModelConfig { topology: Topology::Trbe, ..ModelConfig::default() };
    let Some(o) = run_with(cfg, strategy(Delivery::Watermark, Some(20)), 60_000_000, 5_000_000, true) else { return };
    let share = check(&o, "trbe-by-sample-time");
    assert!(share < 0.5, "expected most windows lost, {:.1}% joined", 100.0 * share);
    assert!(o.stats.join.rejected.get(etm_session::join::RejectReason::NoWindow) > o.truth.len() as u64 / 2);
}

/// Finding 4: with one ETR for every CPU, a pause publishes nothing (`tmc_update_etr_buffer`
/// returns while `refcnt != 1`): without harvests the trace arrives only when the groups
/// stop at the end, and a driver completing samples by their time loses them all.
#[test]
fn shared_etr_pauses_publish_nothing() {
    let cfg = ModelConfig { topology: Topology::SharedEtr, etr_bytes: 8 << 20, aux_bytes: 8 << 20, ..ModelConfig::default() };
    let Some(o) = run_with(cfg, strategy(Delivery::PerPause, None), 30_000_000, 5_000_000, true) else { return };
    assert_eq!(o.model.etr_publishes, 1, "one publication, at the final stop: {:?}", o.model);
    let share = check(&o, "shared-etr-no-harvest");
    assert!(share < 0.05, "{:.1}% joined", 100.0 * share);
}

/// Finding 3: a pause event over `max_samples_per_tick` throttles the whole group; the AUX
/// leader, stopped without PERF_EF_UPDATE, cannot start again (its transaction stays open),
/// so the collector opens the group anew. Windows cut by a throttle are rejected as such, none
/// is joined wrongly, and the trace resumes after each reopen.
#[test]
fn throttled_groups_are_reopened() {
    let cfg = ModelConfig { topology: Topology::Trbe, throttle: Some((500, 4_000_000)), ..ModelConfig::default() };
    let Some(o) = run(cfg, strategy(Delivery::Watermark, Some(20)), 60_000_000, 2_000_000) else { return };
    assert!(o.model.throttles >= 4 && o.collect.reopened >= 4, "{:?} {:?}", o.model, o.collect);
    let share = check(&o, "trbe-throttled");
    assert!(share >= 0.95);
    let rejected = &o.stats.join.rejected;
    assert!(
        rejected.get(etm_session::join::RejectReason::Throttled) + rejected.get(etm_session::join::RejectReason::NoWindow) > 0
    );
    // Complete (and joined) windows after the first throttle: the reopened groups trace again
    // (a stuck AUX leader would trace nothing more).
    let first_th = o.truth.iter().filter(|t| t.loss == Some(etm_synth::hw::Loss::Throttled)).map(|t| t.time).min().unwrap_or(0);
    let after = o.joined.iter().filter(|j| j.1 > first_th).count();
    assert!(after >= 50, "only {after} joined samples after the first throttle");
}

/// A private ETR per CPU: a record per pause, proven complete by the newest record.
#[test]
fn private_etr_per_pause() {
    let cfg = ModelConfig { topology: Topology::PrivateEtr, ..ModelConfig::default() };
    let Some(o) = run(cfg, strategy(Delivery::PerPause, None), 60_000_000, 5_000_000) else { return };
    assert!(check(&o, "private-etr") >= 0.95);
}

/// Without context IDs (no CONFIG_PID_IN_CONTEXTIDR): the switch records and the timestamps
/// place the trace; still exact.
#[test]
fn trbe_without_context_ids() {
    let cfg = ModelConfig { topology: Topology::Trbe, context_ids: false, ..ModelConfig::default() };
    let Some(o) = run(cfg, strategy(Delivery::Watermark, Some(20)), 60_000_000, 5_000_000) else { return };
    assert!(check(&o, "trbe-no-ctxid") >= 0.95);
}
