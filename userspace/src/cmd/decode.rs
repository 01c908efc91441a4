//! `etm-bpf decode` (work in progress: not implemented yet).

use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct DecodeArgs {}

pub fn main(_args: DecodeArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`decode` is not implemented yet")
}
