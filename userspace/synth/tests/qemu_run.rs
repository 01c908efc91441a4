//! The qemu runner neither hangs nor lies at its edges: a program qemu cannot load gives an
//! error (the log pipe is never opened by qemu), a run cut at `max_insns` returns exactly that
//! many instructions, a prefix of the full run, and the full run ends in the exit syscall.

use etm_synth::SynthError;
use etm_synth::a64::{InsnClass, classify};
use etm_synth::image::CodeImage;
use etm_synth::qemu::{self, QemuOptions};
use etm_synth::testprogs::{self, BuildError, Compiler, PROGRAMS};

/// Missing program: an error, quickly. Cut run: a prefix of the full path.
#[test]
fn runner_edges() {
    if let Err(e) = testprogs::qemu_available() {
        etm_testutil::skip(e);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("does-not-exist");
    match qemu::run(&missing, &[], &QemuOptions::default()) {
        Err(SynthError::EmptyTrace { .. }) => {}
        other => panic!("expected EmptyTrace, got {other:?}"),
    }
    let prog = PROGRAMS.iter().find(|p| p.name == "loops").unwrap();
    let bin = match testprogs::build(prog, Compiler::Gcc, tmp.path()) {
        Ok(b) => b,
        Err(BuildError::Missing(why)) => {
            etm_testutil::skip(why);
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let args = vec!["2".to_string()];
    let full = qemu::run(&bin, &args, &QemuOptions::default()).unwrap();
    assert_eq!(full.exit_code, Some(0));
    assert!(!full.stdout.is_empty(), "the program printed its result");
    let image = CodeImage::load(&bin).unwrap();
    assert_eq!(full.pcs[0], image.entry, "the path starts at the ELF entry point");
    let last = *full.pcs.last().unwrap();
    assert_eq!(classify(image.insn(last).unwrap(), last), InsnClass::ExceptionGen, "the path ends in svc (exit)");
    let cut = qemu::run(&bin, &args, &QemuOptions { max_insns: 10_000, ..QemuOptions::default() }).unwrap();
    assert_eq!(cut.pcs.len(), 10_000);
    assert_eq!(cut.pcs[..], full.pcs[..10_000], "same environment, same path");
}
