//! Builds the eBPF program (`ebpf/`, package `etm-bpf-ebpf`) for the BPF target and leaves the
//! object in `OUT_DIR/etm-bpf` for `include_bytes_aligned!`.
//!
//! The nested build is the one aya-build runs (`cargo build --target bpfel-unknown-none
//! -Z build-std=core` with BTF), but its output goes to `OUT_DIR/ebpf-build.log` instead of
//! the user's terminal: the log is shown (as `cargo:warning` lines) only when the build fails.
//!
//! The BPF target is tier 3 and needs `-Z build-std=core`; on the pinned stable toolchain this
//! works with `RUSTC_BOOTSTRAP=1`, which we set for the nested eBPF build only (host crates stay
//! plain stable). See `../shared/docs/toolchain.md`.

use std::fs::File;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, anyhow, bail};
use cargo_metadata::{Artifact, Message};

const PACKAGE: &str = "etm-bpf-ebpf";

fn main() {
    // A sentence, not a Debug dump with a backtrace (the log was shown as warnings).
    if let Err(e) = run() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    if std::env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        return Ok(());
    }
    let meta = cargo_metadata::MetadataCommand::new().no_deps().exec().context("cargo metadata")?;
    let pkg =
        meta.packages.into_iter().find(|p| p.name.as_str() == PACKAGE).ok_or_else(|| anyhow!("{PACKAGE} package not found"))?;
    let root_dir = pkg.manifest_path.parent().ok_or_else(|| anyhow!("no parent for {}", pkg.manifest_path))?.as_str().to_owned();
    // The eBPF sources and the common crate (a path dependency of the eBPF crate).
    println!("cargo:rerun-if-changed={root_dir}");
    println!("cargo:rerun-if-changed={root_dir}/common/src");
    // rustup sets RUSTUP_TOOLCHAIN for build scripts; use the same (pinned) toolchain.
    let toolchain = std::env::var("RUSTUP_TOOLCHAIN").unwrap_or_else(|_| "1.95.0".to_owned());
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").ok_or_else(|| anyhow!("OUT_DIR not set"))?);
    let endian = std::env::var("CARGO_CFG_TARGET_ENDIAN").context("CARGO_CFG_TARGET_ENDIAN not set")?;
    let target = match endian.as_str() {
        "little" => "bpfel-unknown-none",
        "big" => "bpfeb-unknown-none",
        e => bail!("unsupported endianness {e}"),
    };
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").context("CARGO_CFG_TARGET_ARCH not set")?;
    let arch = if arch.starts_with("riscv64") { "riscv64".to_owned() } else { arch };

    let log_path = out_dir.join("ebpf-build.log");
    let result = build(&root_dir, &toolchain, target, &arch, &out_dir, &log_path);
    if let Err(e) = &result {
        // Only now does the nested build's log reach the terminal.
        println!("cargo:warning=building the eBPF program failed: {e:#}");
        if let Ok(f) = File::open(&log_path) {
            for line in BufReader::new(f).lines().map_while(Result::ok) {
                println!("cargo:warning={line}");
            }
        }
        println!("cargo:warning=(full log: {})", log_path.display());
    }
    result
}

/// The nested cargo build; its stderr and compiler messages go to `log_path`.
fn build(root_dir: &str, toolchain: &str, target: &str, arch: &str, out_dir: &Path, log_path: &Path) -> anyhow::Result<()> {
    let log = File::create(log_path).with_context(|| format!("creating {}", log_path.display()))?;
    // `rustup run TOOLCHAIN cargo` when rustup exists (as aya-build does), else plain cargo.
    let rustup = Command::new("rustup").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok();
    let mut cmd = if rustup {
        let mut c = Command::new("rustup");
        c.args(["run", toolchain, "cargo"]);
        c
    } else {
        Command::new("cargo")
    };
    cmd.args(["build", "--package", PACKAGE, "--bins", "--message-format=json", "--release", "--target", target]);
    cmd.args(["-Z", "build-std=core"]);
    cmd.env("RUSTC_BOOTSTRAP", "1");
    let sep = "\x1f";
    cmd.env("CARGO_ENCODED_RUSTFLAGS", format!("--cfg=bpf_target_arch=\"{arch}\"{sep}-Cdebuginfo=2{sep}-Clink-arg=--btf"));
    // The nested build must use the toolchain's own rustc, and a target dir of its own
    // (cargo would otherwise wait for its own lock).
    cmd.env_remove("RUSTC").env_remove("RUSTC_WORKSPACE_WRAPPER");
    cmd.arg("--target-dir").arg(out_dir.join("aya-build").join("target").join(PACKAGE));
    cmd.current_dir(root_dir);
    cmd.stdout(Stdio::piped()).stderr(log.try_clone().context("log file")?);
    let mut child = cmd.spawn().with_context(|| format!("cannot start {cmd:?}"))?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout pipe"))?;
    let mut log = log;
    let mut executables = Vec::new();
    for message in Message::parse_stream(BufReader::new(stdout)) {
        match message.context("the nested cargo wrote invalid JSON")? {
            Message::CompilerArtifact(Artifact { executable: Some(exe), target, .. }) => {
                executables.push((target.name, exe.into_std_path_buf()))
            }
            Message::CompilerMessage(m) => {
                let _ = writeln!(log, "{}", m.message.rendered.unwrap_or_default());
            }
            Message::TextLine(line) => {
                let _ = writeln!(log, "{line}");
            }
            _ => {}
        }
    }
    let status = child.wait().context("waiting for the nested cargo")?;
    if !status.success() {
        bail!("`cargo build --package {PACKAGE} --target {target}` exited with {status}");
    }
    if executables.is_empty() {
        bail!("the nested cargo built no {PACKAGE} executable");
    }
    for (name, exe) in executables {
        let dst = out_dir.join(&name);
        std::fs::copy(&exe, &dst).with_context(|| format!("copying {} to {}", exe.display(), dst.display()))?;
    }
    Ok(())
}
