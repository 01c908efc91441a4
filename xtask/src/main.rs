//! Developer tasks: `cargo xtask <task>`.
//!
//! * `cargo xtask test` — set up and run the whole test suite (`scripts/test.sh`, what CI runs).
//! * `cargo xtask bench decoder|profile|replay|overhead [ARGS...]` — the benchmark scripts in
//!   `bench/` (commands and figures: `bench/README.md`).
//! * `cargo xtask fuzz packets|decode [SECONDS]` — a cargo-fuzz run of the decoder targets in
//!   `userspace/decode/fuzz/` (needs `cargo install cargo-fuzz`; see its README).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context as _, bail};

const BENCHES: &[&str] = &["decoder", "profile", "replay", "overhead"];
const FUZZ_TARGETS: &[&str] = &["packets", "decode"];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask is inside the repo").to_path_buf()
}

fn status(cmd: &mut Command) -> anyhow::Result<ExitCode> {
    let st = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    Ok(if st.success() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn run(args: &[String]) -> anyhow::Result<ExitCode> {
    let root = repo_root();
    match args.first().map(String::as_str) {
        Some("test") => status(Command::new("bash").arg(root.join("scripts/test.sh")).current_dir(&root)),
        Some("bench") => {
            let Some(name) = args.get(1).filter(|n| BENCHES.contains(&n.as_str())) else {
                bail!("usage: cargo xtask bench {}", BENCHES.join("|"));
            };
            let script = root.join("bench").join(format!("{name}.sh"));
            status(Command::new("bash").arg(script).args(&args[2..]).current_dir(&root))
        }
        Some("fuzz") => {
            let Some(target) = args.get(1).filter(|t| FUZZ_TARGETS.contains(&t.as_str())) else {
                bail!("usage: cargo xtask fuzz {} [SECONDS]", FUZZ_TARGETS.join("|"));
            };
            let secs: u64 = match args.get(2) {
                Some(s) => s.parse().with_context(|| format!("SECONDS: not a number: {s}"))?,
                None => 60,
            };
            let dir = root.join("userspace/decode/fuzz");
            let corpus = format!("corpus/{target}");
            std::fs::create_dir_all(dir.join(&corpus)).context("creating the corpus dir")?;
            status(
                Command::new("cargo")
                    .env("RUSTC_BOOTSTRAP", "1")
                    .args(["fuzz", "run", target, "-O", &corpus, "--"])
                    .arg(format!("-max_total_time={secs}"))
                    .arg("-rss_limit_mb=1024")
                    .current_dir(dir),
            )
        }
        _ => {
            eprintln!("usage: cargo xtask test | bench {} [ARGS] | fuzz {} [SECONDS]", BENCHES.join("|"), FUZZ_TARGETS.join("|"));
            Ok(ExitCode::from(2))
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}
