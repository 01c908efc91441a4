//! `etm-bpf convert` (work in progress: not implemented yet).

use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct ConvertArgs {}

pub fn main(_args: ConvertArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`convert` is not implemented yet")
}
