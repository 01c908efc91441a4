//! Exact hybrid samples of an x86-64 program from a `qemu-x86_64 -singlestep -d exec,nochain`
//! run: every executed instruction is logged, so the taken branches (the next executed
//! address is not the fall-through) and a shadow call stack (calls push the return address,
//! returns pop) are known exactly. Every `period` instructions a sample is taken: the
//! current IP, the shadow stack (innermost return address first), and the last `depth` taken
//! branches, newest first -- what LBR + a frame-pointer stack walk would give on hardware.
//! Calls and returns are known inside the program (from its disassembly); inside shared
//! libraries only the return into the program is tracked, so library frames appear as one
//! external frame, as llvm-profgen collapses them anyway.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Call,
    Ret,
    Other,
}

/// address -> (fall-through address, kind), from `llvm-objdump -d`.
pub fn disassemble(objdump: &Path, bin: &Path) -> HashMap<u64, (u64, Kind)> {
    let out = Command::new(objdump).arg("-d").arg("--no-show-raw-insn").arg(bin).output().expect("run llvm-objdump");
    assert!(out.status.success(), "llvm-objdump failed");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut insts: Vec<(u64, Kind)> = Vec::new();
    for line in text.lines() {
        let t = line.trim_start();
        let Some((addr, rest)) = t.split_once(':') else { continue };
        let Ok(a) = u64::from_str_radix(addr, 16) else { continue };
        if !line.starts_with(' ') {
            continue;
        }
        let mnem = rest.split_whitespace().next().unwrap_or("");
        let kind = if mnem.starts_with("call") {
            Kind::Call
        } else if mnem.starts_with("ret") {
            Kind::Ret
        } else {
            Kind::Other
        };
        insts.push((a, kind));
    }
    insts.sort_by_key(|i| i.0);
    let mut map = HashMap::with_capacity(insts.len());
    for w in insts.windows(2) {
        map.insert(w[0].0, (w[1].0, w[0].1));
    }
    map
}

pub struct Sample {
    pub stack: Vec<u64>,
    pub branches: Vec<(u64, u64)>,
}

/// Run `bin args` under qemu single-step and collect samples. Returns (samples, program
/// stdout, instructions executed).
pub fn sample(
    bin: &Path,
    args: &[&str],
    insts: &HashMap<u64, (u64, Kind)>,
    period: u64,
    depth: usize,
) -> (Vec<Sample>, String, u64) {
    let mut child = Command::new("qemu-x86_64")
        .args(["-singlestep", "-d", "exec,nochain", "-D", "/dev/stderr"])
        .arg(bin)
        .args(args)
        .env_clear()
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn qemu-x86_64");
    let stdout = child.stdout.take().unwrap();
    let out_thread = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap_or_default());
    let err = BufReader::with_capacity(1 << 20, child.stderr.take().unwrap());
    let mut shadow: Vec<u64> = Vec::new();
    let mut lbr: std::collections::VecDeque<(u64, u64)> = std::collections::VecDeque::new();
    let mut samples = Vec::new();
    let mut prev: Option<u64> = None;
    let mut n = 0u64;
    for line in err.lines() {
        let Ok(line) = line else { break };
        // Trace 0: 0x7f.. [0000000000000000/00000000004014f0/1040c0b3/00000201] _start
        let Some(pc) = line.split('[').nth(1).and_then(|s| s.split('/').nth(1)).and_then(|s| u64::from_str_radix(s, 16).ok())
        else {
            continue;
        };
        if let Some(p) = prev {
            // Outside the program (libc, ld.so) instruction sizes are unknown: a transfer of
            // at most 15 bytes forward (the longest x86 instruction) is taken as a
            // fall-through. Those branches are external-to-external, which llvm-profgen drops.
            let known = insts.get(&p).copied();
            let (ft, kind) = known.unwrap_or(if pc > p && pc - p <= 15 { (pc, Kind::Other) } else { (0, Kind::Other) });
            match kind {
                Kind::Call if pc != ft => shadow.push(ft),
                Kind::Ret => {
                    shadow.pop();
                }
                // Calls made outside the program are not tracked; a transfer from outside to
                // the innermost tracked return address is the return to it, any other entry
                // into the program is a call from the library (main, init functions): its
                // return address is pushed as the library address it came from (external).
                _ if known.is_none() && pc != ft && insts.contains_key(&pc) => {
                    if shadow.last() == Some(&pc) {
                        shadow.pop();
                    } else {
                        shadow.push(p);
                    }
                }
                _ => {}
            }
            if pc != ft {
                lbr.push_front((p, pc));
                lbr.truncate(depth);
            }
        }
        prev = Some(pc);
        n += 1;
        if n.is_multiple_of(period) && lbr.len() == depth {
            let mut stack = vec![pc];
            stack.extend(shadow.iter().rev());
            samples.push(Sample { stack, branches: lbr.iter().copied().collect() });
        }
    }
    let status = child.wait().expect("wait qemu");
    assert!(status.success(), "program under qemu failed: {status}");
    (samples, out_thread.join().unwrap(), n)
}

/// Write samples as `perf script -F ip,brstack` hybrid text with an MMAP2 line for a non-PIE
/// binary whose first executable segment is at `vaddr`/`offset`.
pub fn write_perfscript(path: &Path, bin: &Path, vaddr: u64, len: u64, offset: u64, samples: &[Sample]) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    writeln!(f, "PERF_RECORD_MMAP2 4242/4242: [{vaddr:#x}({len:#x}) @ {offset:#x} 00:00 0 0]: r-xp {}", bin.display()).unwrap();
    for s in samples {
        writeln!(f).unwrap();
        for a in &s.stack {
            writeln!(f, "\t{a:>16x}").unwrap();
        }
        let mut l = String::new();
        for (fr, to) in &s.branches {
            l.push_str(&format!(" 0x{fr:x}/0x{to:x}/P/-/-/0 "));
        }
        writeln!(f, "{}", l.trim_end()).unwrap();
    }
}
