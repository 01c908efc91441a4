//! Build helper for the AArch64 test programs in `tests/aarch64/` (repository root): compiles
//! them at test time with `aarch64-linux-gnu-gcc` or `clang-22 --target=aarch64-linux-gnu`,
//! `-O2 -static -fno-omit-frame-pointer`. Tools that are missing give [`BuildError::Missing`]
//! so callers print a skip reason.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A cross compiler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compiler {
    /// `aarch64-linux-gnu-gcc`.
    Gcc,
    /// `clang-22 --target=aarch64-linux-gnu` (GNU linker).
    Clang,
}

impl Compiler {
    /// Both compilers.
    pub const ALL: [Compiler; 2] = [Compiler::Gcc, Compiler::Clang];

    /// Short name used in output file names.
    pub fn name(self) -> &'static str {
        match self {
            Compiler::Gcc => "gcc",
            Compiler::Clang => "clang",
        }
    }

    fn command(self) -> Command {
        match self {
            Compiler::Gcc => Command::new("aarch64-linux-gnu-gcc"),
            Compiler::Clang => {
                let mut c = Command::new("clang-22");
                c.arg("--target=aarch64-linux-gnu");
                c
            }
        }
    }
}

/// A test program: its name and its source files (in `tests/aarch64/`), plus extra flags.
#[derive(Debug, Clone, Copy)]
pub struct TestProgram {
    /// Name (output file stem).
    pub name: &'static str,
    /// Source files.
    pub sources: &'static [&'static str],
    /// Extra compiler/linker flags.
    pub flags: &'static [&'static str],
}

/// The test programs.
pub const PROGRAMS: &[TestProgram] = &[
    TestProgram { name: "loops", sources: &["loops.c"], flags: &[] },
    TestProgram { name: "indirect", sources: &["indirect.c"], flags: &[] },
    TestProgram { name: "recursion", sources: &["recursion.c"], flags: &[] },
    TestProgram { name: "switch", sources: &["switch.c"], flags: &[] },
    // Two compilation units; the second one's code lives in its own section placed far from
    // .text (a second executable segment at 0x10000000: long address packets).
    TestProgram { name: "multi", sources: &["multi_main.c", "multi_lib.c"], flags: &["-Wl,--section-start=fartext=0x10000000"] },
    // Fixed shares of three calling contexts (the kernel lab's profiling workload); leaf frame
    // pointers so that every frame of a sampled stack is there.
    TestProgram { name: "contexts", sources: &["contexts.c"], flags: &["-mno-omit-leaf-frame-pointer"] },
    // 256 small functions called in a pseudo-random order: a flat profile.
    TestProgram { name: "flat", sources: &["flat.c"], flags: &[] },
    // Two builds of one program whose functions' instruction shares differ by design.
    TestProgram { name: "ab_a", sources: &["ab.c"], flags: &["-DUA=2", "-DUB=1"] },
    TestProgram { name: "ab_b", sources: &["ab.c"], flags: &["-DUA=1", "-DUB=2"] },
    // Two builds of one program: B runs 6 instructions fewer per call of one function that
    // two callers share, and nothing else differs.
    TestProgram { name: "percall_a", sources: &["percall.c"], flags: &["-DPAD=6"] },
    TestProgram { name: "percall_b", sources: &["percall.c"], flags: &["-DPAD=0"] },
    // Calls whose instructions vary from call to call (pseudo-random loop rounds).
    TestProgram { name: "varying", sources: &["varying.c"], flags: &[] },
];

/// Why a program could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The compiler (or the cross libc) is not installed: skip.
    #[error("{0}")]
    Missing(String),
    /// The compiler failed.
    #[error("compiling {name} with {compiler}: {stderr}")]
    Failed {
        /// Program.
        name: String,
        /// Compiler name.
        compiler: &'static str,
        /// Its stderr.
        stderr: String,
    },
}

/// Directory of the test program sources: `<repo>/tests/aarch64`.
pub fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/aarch64")
}

/// Build `prog` with `compiler` into `out_dir`; returns the binary's path.
pub fn build(prog: &TestProgram, compiler: Compiler, out_dir: &Path) -> Result<PathBuf, BuildError> {
    build_with(prog, compiler, out_dir, &[], "")
}

/// [`build`] with `extra` flags after the usual ones (e.g. `-fomit-frame-pointer`, which
/// overrides `-fno-omit-frame-pointer`), into `<name>-<compiler><suffix>`.
pub fn build_with(
    prog: &TestProgram,
    compiler: Compiler,
    out_dir: &Path,
    extra: &[&str],
    suffix: &str,
) -> Result<PathBuf, BuildError> {
    let src = source_dir();
    let out = out_dir.join(format!("{}-{}{suffix}", prog.name, compiler.name()));
    let mut cmd = compiler.command();
    cmd.args(["-O2", "-static", "-fno-omit-frame-pointer"]).args(extra).arg("-o").arg(&out);
    for s in prog.sources {
        cmd.arg(src.join(s));
    }
    cmd.args(prog.flags);
    let output = match cmd.output() {
        Ok(o) => o,
        Err(e) => {
            return Err(BuildError::Missing(format!(
                "{} not runnable ({e}); install gcc-aarch64-linux-gnu / clang-22 (scripts/setup.sh)",
                compiler.name()
            )));
        }
    };
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        if stderr.contains("No such file") && stderr.contains(".h") || stderr.contains("cannot find crt") {
            return Err(BuildError::Missing(format!("{} has no aarch64 libc: {stderr}", compiler.name())));
        }
        return Err(BuildError::Failed { name: prog.name.into(), compiler: compiler.name(), stderr });
    }
    Ok(out)
}

/// Whether `qemu-aarch64` can be run (for skip messages).
pub fn qemu_available() -> Result<(), BuildError> {
    match Command::new(crate::qemu::QEMU).arg("--version").output() {
        Ok(o) if o.status.success() => Ok(()),
        _ => Err(BuildError::Missing("qemu-aarch64 not runnable; install qemu-user (scripts/setup.sh)".into())),
    }
}
