//! `etm-bpf`: the command-line shell around the etm-bpf libraries.
//!
//! Each subcommand lives in its own module under `cmd/` with its own `clap::Args` struct.

mod cmd;
mod dump;
mod dumper;
mod engine;
mod facts;
mod launch;
mod live;
mod logging;
mod symbolize;
mod tui;
mod unwind;

use clap::{Parser, Subcommand};

/// Online context-sensitive profiler for PGO (AutoFDO, CSSPGO, BOLT).
#[derive(Parser)]
#[command(name = "etm-bpf", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Profile a running process (--pid) or a command (-- CMD) live (eBPF call stacks + branch history).
    Run(cmd::run::RunArgs),
    /// Decode a CoreSight ETMv4/ETE trace snapshot.
    Decode(cmd::decode::DecodeArgs),
    /// Convert perf-script samples into etm-bpf profiles.
    Convert(cmd::convert::ConvertArgs),
    /// Replay a recorded or synthetic session through the live pipeline.
    Replay(cmd::replay::ReplayArgs),
    /// Generate a synthetic ETE session with ground truth from an AArch64 program.
    Synth(cmd::synth::SynthArgs),
    /// What this machine offers for ETM profiling, and what `run` would do.
    Doctor(cmd::doctor::DoctorArgs),
    /// Compare two dumps function by function, with confidence intervals.
    Diff(cmd::diff::DiffArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => cmd::run::main(a),
        Command::Decode(a) => cmd::decode::main(a),
        Command::Convert(a) => cmd::convert::main(a),
        Command::Replay(a) => cmd::replay::main(a),
        Command::Synth(a) => cmd::synth::main(a),
        Command::Doctor(a) => cmd::doctor::main(a),
        Command::Diff(a) => cmd::diff::main(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("etm-bpf: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
