//! `etm-bpf replay` (work in progress: not implemented yet).

use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct ReplayArgs {}

pub fn main(_args: ReplayArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`replay` is not implemented yet")
}
