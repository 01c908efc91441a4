//! `etm-bpf run` (work in progress: not implemented yet).

use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct RunArgs {}

pub fn main(_args: RunArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`run` is not implemented yet")
}
