//! The kernel lab: boots a real Linux kernel (Debian's arm64 package; optionally amd64) under
//! `qemu-system-*` with an initramfs holding the test binaries, runs them there and brings the
//! results back over the console. `cargo xtask lab` drives it (host side: [`host`]); the
//! guest's `/init` is the `etm-lab-init` binary.

pub mod host;
pub mod proto;
pub mod suite;
pub mod truth;
