//! `etm-bpf synth`: run a static AArch64 program under `qemu-aarch64` and write a synthetic
//! ETE session (what the hardware and the eBPF program would have produced) plus its ground
//! truth (`ground_truth.jsonl`, see `docs/synth.md`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;

#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
    etm-bpf synth --out /tmp/sess -- ./prog-aarch64 100\n  \
    etm-bpf synth --out /tmp/sess --window 2000 --period 20000 --snapshot /tmp/ss -- ./prog\n  \
    etm-bpf replay /tmp/sess")]
pub struct SynthArgs {
    /// Session directory to write.
    #[arg(long)]
    out: PathBuf,
    /// Window length in executed instructions (trace on from resume to pause).
    #[arg(long, default_value_t = 1_000)]
    window: u64,
    /// Period between windows in executed instructions (>= window).
    #[arg(long, default_value_t = 100_000)]
    period: u64,
    /// Disable return-stack compression (TRCCONFIGR.RS) in the generated trace.
    #[arg(long)]
    no_retstack: bool,
    /// Also write the trace as an OpenCSD snapshot into this directory (for trc_pkt_lister).
    #[arg(long)]
    snapshot: Option<PathBuf>,
    /// Inject a fault into the written session: KIND@WINDOW with KIND one of truncate,
    /// corrupt, nosync, lost (repeatable; marked in ground_truth.jsonl).
    #[arg(long = "fault", value_name = "KIND@WINDOW", value_parser = etm_synth::generate::parse_fault)]
    faults: Vec<(u64, etm_synth::generate::Fault)>,
    /// Stop after this many executed instructions (8 bytes of memory each).
    #[arg(long, default_value_t = 200_000_000)]
    max_insns: u64,
    /// Emulator binary.
    #[arg(long, default_value = etm_synth::qemu::QEMU)]
    qemu: PathBuf,
    /// The static AArch64 program and its arguments.
    #[arg(required = true, last = true)]
    command: Vec<String>,
}

pub fn main(args: SynthArgs) -> anyhow::Result<ExitCode> {
    use etm_synth::{generate, image, qemu, session_out, snapshot};
    anyhow::ensure!(args.window > 0 && args.period >= args.window, "need 0 < --window <= --period");
    let prog = PathBuf::from(&args.command[0]);
    let prog_args = &args.command[1..];
    let cfg = generate::SynthConfig {
        window: args.window,
        period: args.period,
        retstack: !args.no_retstack,
        faults: args.faults.clone(),
        ..Default::default()
    };
    let mut img = image::CodeImage::load(&prog).with_context(|| format!("reading {}", prog.display()))?;
    let qopts = qemu::QemuOptions { qemu: args.qemu.clone(), max_insns: args.max_insns };
    let run = qemu::run(&prog, prog_args, &qopts).with_context(|| format!("running {} under qemu", prog.display()))?;
    let syn = generate::synthesize(&mut img, &run.pcs, &cfg);
    let w = session_out::write_session(&args.out, &prog, prog_args, run.exit_code, &img, &syn)
        .with_context(|| format!("writing session {}", args.out.display()))?;
    if let Some(ss) = &args.snapshot {
        snapshot::write_snapshot(ss, &img, &syn).with_context(|| format!("writing snapshot {}", ss.display()))?;
    }
    let s = &syn.stats;
    println!(
        "synth: {} instructions ({} taken branches, {} not taken, {} svc, {} gaps), exit {:?}; \
         {} windows of {} every {} -> {} AUX bytes in {}",
        s.insns,
        s.taken_branches,
        s.not_taken,
        s.exceptions,
        s.gaps,
        run.exit_code,
        w.windows,
        cfg.window,
        cfg.period,
        w.aux_bytes,
        args.out.display()
    );
    if w.windows == 0 {
        eprintln!(
            "etm-bpf synth: warning: the run ({} instructions) is not longer than --period {}: no window written",
            s.insns, cfg.period
        );
    }
    if s.gaps > 0 || s.outside_image > 0 || s.unmatched_returns > 0 {
        log::warn!(
            "path anomalies: {} gaps, {} instructions outside the image, {} unmatched returns",
            s.gaps,
            s.outside_image,
            s.unmatched_returns
        );
    }
    Ok(ExitCode::SUCCESS)
}
