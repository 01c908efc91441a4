//! Logging set-up: to stderr normally, to a file when the terminal belongs to the live view.

use std::fs::OpenOptions;
use std::path::Path;

use anyhow::Context as _;

/// Logs to stderr at the level in `RUST_LOG` (default `warn`).
pub fn init_stderr() {
    let _ =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).format_timestamp_millis().try_init();
}

/// Logs to `path` (appending) at the level in `RUST_LOG` (default `info`); nothing reaches
/// the terminal.
pub fn init_file(path: &Path) -> anyhow::Result<()> {
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open log file {}", path.display()))?;
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .target(env_logger::Target::Pipe(Box::new(f)))
        .try_init();
    Ok(())
}
