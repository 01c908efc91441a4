//! Writes a session shaped like hardware (the driver model, `etm_synth::hw_run`) for memory
//! and throughput measurements of `etm-bpf replay` (bench/README.md, "Memory"):
//!
//!     cargo run --release -p etm-synth --example hw_session -- DIR trbe|etr CPUS MS
//!
//! CPUS CPUs (threads scaled with them, `hw_run::tasks_for`) for MS ms of model time; `etr` is
//! one ETR shared by every CPU (formatted frames with every trace ID, harvested), `trbe` a
//! TRBE per CPU.

use etm_live::collect::{Delivery, Strategy};
use etm_synth::hw::{ModelConfig, Topology};
use etm_synth::hw_run::{self, RunOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.len() != 4 {
        return Err("usage: hw_session DIR trbe|etr CPUS MS".into());
    }
    let (dir, cpus, ms): (&str, u32, u64) = (&a[0], a[2].parse()?, a[3].parse()?);
    let (topology, delivery, harvest) = match a[1].as_str() {
        "trbe" => (Topology::Trbe, Delivery::Watermark, 20),
        "etr" => (Topology::SharedEtr, Delivery::Harvest, 5),
        t => return Err(format!("topology {t}: trbe or etr").into()),
    };
    let work = std::env::temp_dir().join(format!("hw-session-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let progs = hw_run::build_programs(&work)?;
    let mut cfg = ModelConfig { cpus, topology, ..ModelConfig::default() };
    if topology == Topology::SharedEtr {
        // The ETR holds every CPU's trace between harvests.
        cfg.etr_bytes = 64 << 20;
        cfg.aux_bytes = 64 << 20;
    }
    let opts = RunOptions {
        strategy: Strategy { delivery, harvest_every_ns: Some(harvest * 1_000_000) },
        duration_ns: ms * 1_000_000,
        drain_ns: 1_000_000,
        complete_by_sample_time: false,
        record: Some(dir.into()),
        tasks: Some(hw_run::tasks_for(cpus)),
    };
    let o = hw_run::run(&progs, cfg, &opts)?;
    let c = hw_run::check(&o.truth, &o.joined);
    println!(
        "{dir}: {cpus} CPUs, {ms} ms, {} target windows, {} complete, {} joined ({:.1}%), {} wrong, {} AUX bytes",
        c.windows,
        c.complete,
        c.joined_complete,
        100.0 * c.share(),
        c.wrong.len(),
        o.stats.aux_bytes
    );
    let _ = std::fs::remove_dir_all(work);
    Ok(())
}
