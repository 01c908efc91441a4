//! Developer tasks: `cargo xtask <task>`.
//!
//! * `cargo xtask test` — set up and run the whole test suite (`scripts/test.sh`, what CI runs).
//! * `cargo xtask bench decoder|profile|replay|overhead [ARGS...]` — the benchmark scripts in
//!   `bench/` (commands and figures: `bench/README.md`).
//! * `cargo xtask fuzz packets|decode [SECONDS]` — a cargo-fuzz run of the decoder targets in
//!   `userspace/decode/fuzz/` (needs `cargo install cargo-fuzz`; see its README).
//! * `cargo xtask lab arm64` — the kernel lab (`etm_lab::suite`): Debian's arm64 kernel under
//!   qemu-system-aarch64 running the product and its kernel-facing tests; report in
//!   `target/lab/arm64/report.txt`, packages cached in `$ETM_BPF_LAB_CACHE` (default
//!   `~/.cache/etm-bpf/lab`).

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
        Some("lab") => {
            if args.get(1).map(String::as_str) != Some("arm64") {
                bail!("usage: cargo xtask lab arm64");
            }
            lab(&root)
        }
        _ => {
            eprintln!(
                "usage: cargo xtask test | bench {} [ARGS] | fuzz {} [SECONDS] | lab arm64",
                BENCHES.join("|"),
                FUZZ_TARGETS.join("|")
            );
            Ok(ExitCode::from(2))
        }
    }
}

/// The arm64 lab. When the emulator cannot start here it says so and skips, except under CI,
/// where that fails.
fn lab(root: &Path) -> anyhow::Result<ExitCode> {
    let mut machine = etm_lab::host::MachineConfig::arm64();
    if std::env::var("ETM_BPF_LAB_ICOUNT").is_ok_and(|v| v == "0") {
        machine.icount = false;
    }
    if let Some(cpu) = std::env::var_os("ETM_BPF_LAB_CPU") {
        machine.machine[3] = cpu.to_string_lossy().into_owned();
    }
    if let Err(why) = etm_lab::host::emulator_available(&machine.qemu) {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
        eprintln!("{} lab arm64: {why}", if ci { "FAIL" } else { "SKIP:" });
        return Ok(if ci { ExitCode::FAILURE } else { ExitCode::SUCCESS });
    }
    let cache = std::env::var_os("ETM_BPF_LAB_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/etm-bpf/lab")))
        .unwrap_or_else(|| root.join("target/lab/cache"));
    let opts = etm_lab::suite::Options {
        root: root.to_path_buf(),
        cache,
        out: root.join("target/lab/arm64"),
        kernel: etm_lab::host::ARM64_KERNEL,
        machine,
    };
    let rep = etm_lab::suite::run(&opts)?;
    for l in &rep.lines {
        println!("lab arm64: {l}");
    }
    println!(
        "lab arm64: {} checks, {} failed (report: {})",
        rep.lines.iter().filter(|l| !l.starts_with("     ")).count(),
        rep.failures.len(),
        opts.out.join("report.txt").display()
    );
    Ok(if rep.failures.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
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
