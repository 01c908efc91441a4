//! The executed path of an AArch64 program, from `qemu-aarch64 -singlestep -d exec,nochain`.
//!
//! With `-singlestep` every translation block holds one instruction, and with `nochain` every
//! execution of a block goes through the main loop and is logged, so the log is the exact
//! sequence of executed guest PCs (`../shared/docs/ground-truth.md`). Log line (QEMU 7.2):
//!
//! ```text
//! Trace 0: 0x7f9920000100 [0000000001009331/00000000004005c0/00000001/00000201] _start
//!          host code       cs_base          /guest PC        /flags   /cflags  symbol
//! ```
//!
//! The program runs with an empty environment (`env -i`), stdin from `/dev/null`, stdout and
//! stderr to files, so its path depends only on its arguments and its path name.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::SynthError;

/// The emulator binary.
pub const QEMU: &str = "qemu-aarch64";

/// Result of one emulated run.
#[derive(Debug, Clone)]
pub struct QemuRun {
    /// Executed guest PCs in order, one per instruction.
    pub pcs: Vec<u64>,
    /// Exit code of the program (`None` if killed by a signal).
    pub exit_code: Option<i32>,
    /// What the program wrote to stdout.
    pub stdout: Vec<u8>,
    /// Log lines that were not instruction lines (counted, skipped).
    pub other_lines: u64,
}

/// Options of a run.
#[derive(Debug, Clone)]
pub struct QemuOptions {
    /// Emulator to run (default [`QEMU`]).
    pub qemu: PathBuf,
    /// Stop parsing after this many instructions (bounded memory; 8 bytes each).
    pub max_insns: u64,
}

impl Default for QemuOptions {
    fn default() -> Self {
        QemuOptions { qemu: PathBuf::from(QEMU), max_insns: 200_000_000 }
    }
}

/// Run `prog args...` under qemu-user and return its exact executed path.
///
/// The log goes through a named pipe and is parsed while qemu runs (no disk space: a log
/// line is ~100 bytes per instruction). When `max_insns` is reached the pipe is closed and
/// qemu dies of SIGPIPE (`exit_code` is then `None`).
pub fn run(prog: &Path, args: &[String], opts: &QemuOptions) -> Result<QemuRun, SynthError> {
    let tmp = tempfile::tempdir().map_err(|source| SynthError::Io { path: std::env::temp_dir(), source })?;
    let log = tmp.path().join("exec.fifo");
    let out = tmp.path().join("stdout");
    let err = tmp.path().join("stderr");
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| SynthError::Io { path: p, source }
    };
    let mk = Command::new("mkfifo")
        .arg(&log)
        .status()
        .map_err(|source| SynthError::Spawn { program: PathBuf::from("mkfifo"), source })?;
    if !mk.success() {
        return Err(SynthError::Io { path: log, source: std::io::Error::other("mkfifo failed") });
    }
    let mut child = Command::new(&opts.qemu)
        .env_clear()
        .arg("-singlestep")
        .arg("-d")
        .arg("exec,nochain")
        .arg("-D")
        .arg(&log)
        .arg(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(File::create(&out).map_err(io(&out))?)
        .stderr(File::create(&err).map_err(io(&err))?)
        .spawn()
        .map_err(|source| SynthError::Spawn { program: opts.qemu.clone(), source })?;
    let (fifo, max) = (log.clone(), opts.max_insns);
    let reader = std::thread::spawn(move || -> std::io::Result<(Vec<u64>, u64)> {
        let f = BatchingReader { inner: File::open(&fifo)?, last: usize::MAX };
        parse_log(BufReader::with_capacity(1 << 20, f), max)
    });
    let status = child.wait().map_err(|source| SynthError::Spawn { program: opts.qemu.clone(), source })?;
    // If qemu exited without opening the log, the reader is still blocked in open(): open the
    // write side without blocking (fails with ENXIO until the reader is in open()) and close it,
    // so the reader sees end of file.
    while !reader.is_finished() {
        use std::os::unix::fs::OpenOptionsExt;
        const O_NONBLOCK: i32 = 0o4000; // Linux, all architectures we build for
        drop(std::fs::OpenOptions::new().write(true).custom_flags(O_NONBLOCK).open(&log));
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let (pcs, other_lines) = match reader.join() {
        Ok(r) => r.map_err(io(&log))?,
        Err(_) => return Err(SynthError::Io { path: log, source: std::io::Error::other("log reader panicked") }),
    };
    if pcs.is_empty() {
        let stderr = std::fs::read_to_string(&err).unwrap_or_default();
        return Err(SynthError::EmptyTrace { program: prog.to_path_buf(), stderr });
    }
    let stdout = std::fs::read(&out).unwrap_or_default();
    Ok(QemuRun { pcs, exit_code: status.code(), stdout, other_lines })
}

/// qemu writes its log line-buffered (one `write` per instruction): reading the pipe as soon
/// as data arrives costs a context switch per line. After a short read, wait 2 ms so the pipe
/// (64 KiB) fills with a few hundred lines first.
struct BatchingReader {
    inner: File,
    last: usize,
}

impl std::io::Read for BatchingReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.last < 16 << 10 {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let n = self.inner.read(buf)?;
        self.last = n;
        Ok(n)
    }
}

/// Parse a `-d exec` log: the guest PC of every `Trace` line, up to `max` of them.
/// Returns the PCs and the number of other (skipped) lines.
pub fn parse_log(mut r: impl BufRead, max: u64) -> std::io::Result<(Vec<u64>, u64)> {
    let mut pcs = Vec::new();
    let mut other = 0u64;
    let mut line = Vec::with_capacity(160);
    loop {
        line.clear();
        if r.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        match parse_line(&line) {
            Some(pc) => {
                if pcs.len() as u64 >= max {
                    break;
                }
                pcs.push(pc)
            }
            None => other += 1,
        }
    }
    Ok((pcs, other))
}

/// The guest PC of one `Trace N: host [cs_base/pc/flags/cflags] sym` line.
fn parse_line(line: &[u8]) -> Option<u64> {
    if !line.starts_with(b"Trace ") {
        return None;
    }
    let open = line.iter().position(|&b| b == b'[')?;
    let rest = &line[open + 1..];
    let slash = rest.iter().position(|&b| b == b'/')?;
    let rest = &rest[slash + 1..];
    let end = rest.iter().position(|&b| b == b'/')?;
    let hex = std::str::from_utf8(&rest[..end]).ok()?;
    u64::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The guest PC is the second field in brackets; other lines are counted, not parsed.
    #[test]
    fn parses_qemu_72_exec_lines() {
        let log = b"Trace 0: 0x7f9920000100 [0000000001009331/00000000004005c0/00000001/00000201] _start\n\
            Linking TBs 0x1 [00400000] index 0 -> 0x2 [00400010]\n\
            Trace 0: 0x7f9920000200 [0000000001009331/0000ffff004005c4/00000001/00000201] \n";
        let (pcs, other) = parse_log(&log[..], 100).unwrap();
        assert_eq!(pcs, vec![0x4005c0, 0xffff_0040_05c4]);
        assert_eq!(other, 1);
        let (pcs, _) = parse_log(&log[..], 1).unwrap();
        assert_eq!(pcs.len(), 1);
    }
}
