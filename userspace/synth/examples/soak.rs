//! Soak of the one pipeline (bench/README.md, "Soak"): a session shaped like hardware from the
//! driver model (`etm_synth::hw_run`, a private ETR per CPU, so one AUX record per pause), replayed into
//! one `Pipeline` again and again as if the run went on — every loop's records shifted by the
//! session's length in perf time and by its AUX size in each CPU's ring — until the traced
//! CPUs have executed `MINUTES` minutes of model time. Prints RSS, windows/s and the pipeline's
//! counters as it goes; fails (exit 1) if a loop joins a different number of samples than the
//! first, if the first loop's samples differ from the model's ground truth, or if anything is
//! rejected or dropped.
//!
//!     cargo run --release -p etm-synth --example soak -- CPUS MS MINUTES [perpause|watermark|harvest]
//!
//! The model (about 130x slower than the time it models) runs once for `MS` ms; the loops
//! cost only the pipeline. Delivery (default `perpause`): a private ETR per CPU, one AUX
//! record per pause, windows dated by their AUX records (`trace_timestamps = false`, the live
//! path's rule for per-pause delivery); `watermark`: a TRBE per CPU publishing at its
//! watermark, `harvest`: one ETR shared by every CPU (formatted, every trace ID) harvested
//! every 5 ms — both date windows by the trace's own timestamps, which repeat with the loops,
//! so each loop's trace clock is shifted with its perf times (`Pipeline::set_clock`: the
//! conversion's `time_zero` moved by the loop's offset, as perf's user page would give).
//! `EXACT=0` in the environment leaves the exact counts out (`replay --no-exact`: the decoder
//! then hands the pipeline taken branches, its runs going through compressed returns).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Instant;

use etm_live::collect::{Delivery, Strategy};
use etm_session::pipeline::{Pipeline, PipelineConfig};
use etm_session::session::{AuxRecord, PauseSample, SessionEvent, SessionReader, Sideband};
use etm_synth::hw::{ModelConfig, Topology};
use etm_synth::hw_run::{self, RunOptions};

/// An owned copy of one recorded event.
enum Owned {
    Aux(AuxRecord, Vec<u8>),
    Sample(PauseSample),
    Sideband(Sideband),
}

impl Owned {
    fn event(&self) -> SessionEvent<'_> {
        match self {
            Owned::Aux(record, data) => SessionEvent::Aux { record: *record, data },
            Owned::Sample(s) => SessionEvent::Sample(s),
            Owned::Sideband(s) => SessionEvent::Sideband(s),
        }
    }
}

fn rss_kib() -> u64 {
    etm_testutil::self_status_kib("VmRSS")
}

/// CPU time of this process.
fn cpu_s() -> f64 {
    etm_testutil::cpu_seconds(std::process::id()).unwrap_or(0.0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.len() != 3 && a.len() != 4 {
        return Err("usage: soak CPUS MS MINUTES [perpause|watermark|harvest]".into());
    }
    let (cpus, ms, minutes): (u32, u64, f64) = (a[0].parse()?, a[1].parse()?, a[2].parse()?);
    let delivery = a.get(3).map_or("perpause", String::as_str);
    let work = std::env::temp_dir().join(format!("soak-{}", std::process::id()));
    let dir = work.join("session");
    std::fs::create_dir_all(&work)?;
    let progs = hw_run::build_programs(&work)?;
    let (topology, delivery, harvest_ms) = match delivery {
        "perpause" => (Topology::PrivateEtr, Delivery::PerPause, None),
        "watermark" => (Topology::Trbe, Delivery::Watermark, Some(20)),
        "harvest" => (Topology::SharedEtr, Delivery::Harvest, Some(5)),
        d => return Err(format!("delivery {d}: perpause, watermark or harvest").into()),
    };
    let mut cfg = ModelConfig { cpus, topology, ..ModelConfig::default() };
    if topology == Topology::SharedEtr {
        // The ETR holds every CPU's trace between harvests.
        cfg.etr_bytes = 64 << 20;
        cfg.aux_bytes = 64 << 20;
    }
    let opts = RunOptions {
        strategy: Strategy { delivery, harvest_every_ns: harvest_ms.map(|m| m * 1_000_000) },
        duration_ns: ms * 1_000_000,
        drain_ns: 1_000_000,
        complete_by_sample_time: false,
        record: Some(dir.clone()),
        tasks: Some(hw_run::tasks_for(cpus)),
    };
    let t0 = Instant::now();
    let o = hw_run::run(&progs, cfg, &opts)?;
    eprintln!("model: {cpus} CPUs, {ms} ms in {:.1} s", t0.elapsed().as_secs_f64());

    // The recorded session, in memory.
    let mut reader = SessionReader::open(&dir)?;
    let meta = reader.meta().clone();
    let images: Vec<(String, Vec<u8>)> =
        meta.images.iter().map(|i| Ok((i.path.clone(), std::fs::read(reader.image_path(i))?))).collect::<std::io::Result<_>>()?;
    let mut events = Vec::new();
    while let Some(ev) = reader.next_event()? {
        events.push(match ev {
            SessionEvent::Aux { record, data } => Owned::Aux(record, data.to_vec()),
            SessionEvent::Sample(s) => Owned::Sample(s.clone()),
            SessionEvent::Sideband(s) => Owned::Sideband(s.clone()),
        });
    }
    let (first, last) = (events.first().map_or(0, |e| e.event().time()), events.last().map_or(0, |e| e.event().time()));
    let span = last - first + 1_000_000;
    let mut aux_len: HashMap<i32, u64> = HashMap::new();
    for e in &events {
        if let Owned::Aux(r, _) = e {
            let end = r.aux_offset + r.size;
            let l = aux_len.entry(r.cpu).or_default();
            *l = (*l).max(end);
        }
    }

    let mut pc = PipelineConfig::from_meta(&meta);
    // Per-pause delivery: windows dated by their AUX records; otherwise by the trace.
    pc.trace_timestamps = delivery != Delivery::PerPause;
    let trace_clock = pc.trace_timestamps.then_some(meta.clock);
    pc.exact = std::env::var("EXACT").map_or(true, |v| v != "0");
    let exact = pc.exact;
    let mut p = Pipeline::new(pc);
    for (path, bytes) in images {
        p.add_image(&path, bytes);
    }
    let loop_joined = Rc::new(Cell::new(0u64));
    let first_loop: Rc<RefCell<Vec<hw_run::Joined>>> = Rc::default();
    let (lj, fl, loop0_end) = (loop_joined.clone(), first_loop.clone(), first + span);
    p.set_observer(Box::new(move |s| {
        lj.set(lj.get() + 1);
        if s.time < loop0_end {
            fl.borrow_mut().push((s.cpu, s.time, s.tid, s.branches.to_vec()));
        }
    }));

    let loops = ((minutes * 60_000.0) / (ms as f64 * f64::from(cpus))).ceil().max(1.0) as u64;
    let report_every = (loops / 10).max(1);
    println!(
        "loops {loops} of {ms} ms on {cpus} CPUs ({topology:?}, {delivery:?} delivery{}) = {minutes} min of traced CPU time; {} events per loop",
        if exact { "" } else { ", no exact counts" },
        events.len()
    );
    println!("{:>6} {:>10} {:>12} {:>10} {:>9} {:>12}", "loop", "windows", "AUX MiB", "RSS KiB", "CPU s", "windows/CPU s");
    let cpu0 = cpu_s();
    let mut expected = None;
    let mut bad = Vec::new();
    for k in 0..loops {
        loop_joined.set(0);
        let dt = k * span;
        if let Some(c) = trace_clock {
            // The trace's timestamps repeat: this loop's convert to its shifted perf times.
            let identity = etm_session::session::ClockParams { time_mult: 1, ..Default::default() };
            let c = c.unwrap_or(identity);
            p.set_clock(Some(etm_session::session::ClockParams { time_zero: c.time_zero + dt, ..c }));
        }
        for e in &events {
            match e {
                Owned::Aux(r, data) => {
                    let mut r = *r;
                    r.time += dt;
                    r.aux_offset += k * aux_len.get(&r.cpu).copied().unwrap_or(0);
                    p.push(SessionEvent::Aux { record: r, data });
                }
                Owned::Sample(s) => {
                    let mut s = s.clone();
                    s.time += dt;
                    p.push(SessionEvent::Sample(&s));
                }
                Owned::Sideband(s) => {
                    // The process's mappings and names stay; the rest happens again.
                    if k > 0 && matches!(s, Sideband::Mmap2 { .. } | Sideband::Comm { .. }) {
                        continue;
                    }
                    let mut s = s.clone();
                    *s.time_mut() += dt;
                    p.push(SessionEvent::Sideband(&s));
                }
            }
        }
        // Samples near a loop's end join when the next loop's records arrive, so loops are
        // compared from the second on.
        let n = loop_joined.get();
        if k >= 1 {
            match expected {
                None => expected = Some(n),
                Some(e) if e != n => bad.push(format!("loop {k}: {n} samples joined, loop 1 joined {e}")),
                _ => {}
            }
        }
        if (k + 1) % report_every == 0 || k + 1 == loops {
            let st = p.stats();
            let secs = cpu_s() - cpu0;
            println!(
                "{:>6} {:>10} {:>12.1} {:>10} {:>9.1} {:>12.0}",
                k + 1,
                st.join.samples,
                st.aux_bytes as f64 / (1 << 20) as f64,
                rss_kib(),
                secs,
                st.join.samples as f64 / secs
            );
        }
    }
    p.finish();
    let st = p.stats();
    let truth = hw_run::check(&o.truth, &first_loop.borrow());
    println!(
        "first loop against the model's truth: {} complete windows, {} joined, {} wrong",
        truth.complete,
        truth.joined_complete,
        truth.wrong.len()
    );
    println!(
        "total: {} windows, {} joined, {} rejected, {} profiled, {} stack-only, decode errors {}, gaps {}, lost records {}",
        st.join.samples,
        st.join.joined,
        st.rejected().total(),
        st.profiled,
        st.stack_only_samples,
        st.decode_errors,
        st.aux_gaps,
        st.lost_records
    );
    if truth.joined_complete != truth.complete || !truth.wrong.is_empty() {
        bad.push(format!(
            "first loop: {} of {} complete windows joined (missed e.g. {:?}); {} wrong, e.g. {:?}",
            truth.joined_complete,
            truth.complete,
            truth.missed,
            truth.wrong.len(),
            truth.wrong.first()
        ));
    }
    // What may be rejected: the windows the model itself left incomplete, in every loop.
    let incomplete = (truth.windows - truth.complete) as u64;
    if st.rejected().total() > incomplete * loops || st.decode_errors > 0 || st.join.joined != st.profiled {
        bad.push(format!(
            "{} samples rejected (the model left {incomplete} of each loop's windows incomplete), {} decode errors, {} joined but {} profiled",
            st.rejected().total(),
            st.decode_errors,
            st.join.joined,
            st.profiled
        ));
    }
    eprintln!("rejected: {:?}", st.rejected());
    if std::env::var_os("SOAK_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&work);
    } else {
        eprintln!("kept {}", work.display());
    }
    if !bad.is_empty() {
        for b in &bad {
            eprintln!("soak: {b}");
        }
        std::process::exit(1);
    }
    Ok(())
}
