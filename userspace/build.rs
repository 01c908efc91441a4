//! Builds the eBPF program (`ebpf/`, package `etm-bpf-ebpf`) for the BPF target with aya-build
//! and leaves the object in `OUT_DIR/etm-bpf` for `include_bytes_aligned!`.
//!
//! The BPF target is tier 3 and needs `-Z build-std=core`; on the pinned stable toolchain this
//! works with `RUSTC_BOOTSTRAP=1`, which we set for the nested eBPF build only (host crates stay
//! plain stable). See `../shared/docs/toolchain.md`.

use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let meta = cargo_metadata::MetadataCommand::new().no_deps().exec().context("cargo metadata")?;
    let pkg = meta
        .packages
        .into_iter()
        .find(|p| p.name.as_str() == "etm-bpf-ebpf")
        .ok_or_else(|| anyhow!("etm-bpf-ebpf package not found"))?;
    let root_dir = pkg.manifest_path.parent().ok_or_else(|| anyhow!("no parent for {}", pkg.manifest_path))?.as_str().to_owned();
    // The common crate is a path dependency of the eBPF crate: rebuild when it changes too.
    println!("cargo:rerun-if-changed={root_dir}/common/src");
    // rustup sets RUSTUP_TOOLCHAIN for build scripts; use the same (pinned) toolchain.
    let toolchain = std::env::var("RUSTUP_TOOLCHAIN").unwrap_or_else(|_| "1.95.0".to_owned());
    // aya-build reads RUSTC_BOOTSTRAP from its own environment to decide on -Z build-std; it
    // is inherited by the nested cargo only (this build script's process).
    // SAFETY: single-threaded build script, set before any thread is spawned.
    unsafe { std::env::set_var("RUSTC_BOOTSTRAP", "1") };
    aya_build::build_ebpf(
        [Package { name: "etm-bpf-ebpf", root_dir: &root_dir, ..Default::default() }],
        Toolchain::Custom(&toolchain),
    )
}
