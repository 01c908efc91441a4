//! `etm-synth`: synthetic ETE sessions with exact ground truth, from real AArch64 programs run
//! under `qemu-aarch64` on any host.
//!
//! Pipeline:
//!
//! 1. [`qemu::run`] runs a static AArch64 program with `-singlestep -d exec,nochain` and returns
//!    the exact sequence of executed PCs;
//! 2. [`image::CodeImage`] reads the program's executable segments (the `object` crate) and
//!    [`a64::classify`] classifies each executed instruction word (from the Arm ARM encoding
//!    tables);
//! 3. [`generate::synthesize`] walks the path once: it tracks the true call stack
//!    ([`truth::CallStack`]), and for windows opened and closed at a fixed period (in executed
//!    instructions) writes what an ETE would have produced ([`ete::Encoder`]: A-sync, Trace
//!    Info, timestamps, Trace On, address with context, atoms, indirect targets with address
//!    history compression and return-stack compression, exceptions) and what the eBPF program
//!    would have captured at the pause (leaf PC + return addresses), plus the ground truth
//!    (true branches and instruction ranges per window, [`truth`]);
//! 4. [`session_out::write_session`] writes a session directory through
//!    `etm_session::session::SessionWriter` plus `ground_truth.jsonl` ([`gtfile`]), and
//!    [`snapshot::write_snapshot`] writes the same trace as an OpenCSD snapshot so that
//!    `trc_pkt_lister` can check the generator independently.
//!
//! Design constraints: the encoder is written from the ETE/ETMv4 packet tables, not from our
//! decoder; memory is bounded by the path (8 bytes per executed instruction, capped by
//! [`qemu::QemuOptions::max_insns`]); the library never prints.
//!
//! ```no_run
//! use etm_synth::{generate::SynthConfig, synth_session};
//! let cfg = SynthConfig { window: 1_000, period: 20_000, ..SynthConfig::default() };
//! let out = synth_session("prog".as_ref(), &[], "session-dir".as_ref(), &cfg, &Default::default())?;
//! println!("{} windows", out.windows);
//! # Ok::<(), etm_synth::SynthError>(())
//! ```

pub mod a64;
pub mod ete;
pub mod formatter;
pub mod generate;
pub mod gtfile;
pub mod hw;
pub mod hw_run;
pub mod image;
pub mod qemu;
pub mod session_out;
pub mod snapshot;
pub mod testprogs;
pub mod truth;

use std::path::{Path, PathBuf};

/// Errors of the generator.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The program is not a usable AArch64 ELF file.
    #[error("{path}: not a usable aarch64 elf program: {reason}")]
    Elf {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The emulator could not be started.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The emulator.
        program: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The emulator logged no instruction.
    #[error("qemu logged no instruction for {program}: {stderr}")]
    EmptyTrace {
        /// The program.
        program: PathBuf,
        /// What qemu printed.
        stderr: String,
    },
    /// Writing the session failed.
    #[error("writing the session: {0}")]
    Session(#[from] etm_session::session::SessionError),
}

/// Summary of [`synth_session`].
#[derive(Debug, Clone, Default)]
pub struct SynthSummary {
    /// Executed instructions.
    pub insns: u64,
    /// Windows written.
    pub windows: u64,
    /// AUX bytes written.
    pub aux_bytes: u64,
    /// Program exit code.
    pub exit_code: Option<i32>,
    /// Whole-path counters.
    pub stats: truth::PathStats,
}

/// Run `prog args` under qemu and write a synthetic session with ground truth into `out`.
pub fn synth_session(
    prog: &Path,
    args: &[String],
    out: &Path,
    cfg: &generate::SynthConfig,
    qopts: &qemu::QemuOptions,
) -> Result<SynthSummary, SynthError> {
    let mut image = image::CodeImage::load(prog)?;
    let run = qemu::run(prog, args, qopts)?;
    let syn = generate::synthesize(&mut image, &run.pcs, cfg);
    let w = session_out::write_session(out, prog, args, run.exit_code, &image, &syn)?;
    Ok(SynthSummary {
        insns: run.pcs.len() as u64,
        windows: w.windows,
        aux_bytes: w.aux_bytes,
        exit_code: run.exit_code,
        stats: syn.stats,
    })
}
