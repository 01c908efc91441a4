//! `etm-bpf synth` (work in progress: not implemented yet).

use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct SynthArgs {}

pub fn main(_args: SynthArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`synth` is not implemented yet")
}
