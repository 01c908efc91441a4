//! One module per subcommand; each owns its `clap::Args` and a `main` returning an exit code.

pub mod convert;
pub mod decode;
pub mod diff;
pub mod doctor;
pub mod replay;
pub mod run;
pub mod synth;
