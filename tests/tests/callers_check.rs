//! The callers check (`CodeMap::call_before`: `etm_session::isa`) against binutils' disassembler: on real libraries
//! of both architectures, the address after every instruction `objdump -d` calls a call is
//! accepted as a return address, and the addresses after other instructions are rejected —
//! all of them on A64 (one fixed-width word decides), nearly all on x86-64 (where a suffix of
//! the preceding bytes can decode as a call by chance; the rate is measured and bounded).

use std::collections::BTreeMap;
use std::process::Command;

use etm_session::isa::{InsnKind, X86_MAX_INSN, a64_kind, x86_after_call};

/// The architectures of the test binaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CodeArch {
    A64,
    X86_64,
}

/// The rule under test on the bytes before `ret`.
fn call_ends_at(arch: CodeArch, before: &[u8], ret: u64) -> bool {
    match arch {
        CodeArch::A64 => {
            before.len() >= 4 && {
                let w = &before[before.len() - 4..];
                a64_kind(u32::from_le_bytes([w[0], w[1], w[2], w[3]])) == InsnKind::Call
            }
        }
        CodeArch::X86_64 => x86_after_call(&before[before.len().saturating_sub(X86_MAX_INSN)..], ret),
    }
}

/// `addr -> (bytes, mnemonic)` of every instruction objdump prints.
fn disassemble(objdump: &str, file: &str, arch: CodeArch) -> Option<BTreeMap<u64, (Vec<u8>, String)>> {
    let o = match Command::new(objdump).args(["-d", "--insn-width=16", file]).output() {
        Ok(o) if o.status.success() => o,
        r => {
            etm_testutil::skip(format!(
                "{objdump} -d {file} failed: {r:?} (scripts/setup.sh installs binutils and the arm64 cross libc)"
            ));
            return None;
        }
    };
    let text = String::from_utf8_lossy(&o.stdout);
    let mut out = BTreeMap::new();
    for l in text.lines() {
        let mut f = l.splitn(3, '\t');
        let (Some(a), Some(hex), Some(m)) = (f.next(), f.next(), f.next()) else { continue };
        let Some(Ok(addr)) = a.trim().strip_suffix(':').map(|a| u64::from_str_radix(a, 16)) else { continue };
        let bytes: Vec<u8> = match arch {
            // A64: one 32-bit word printed as its value.
            CodeArch::A64 => match u32::from_str_radix(hex.trim(), 16) {
                Ok(w) if hex.trim().len() == 8 => w.to_le_bytes().to_vec(),
                _ => continue,
            },
            CodeArch::X86_64 => match hex.split_whitespace().map(|b| u8::from_str_radix(b, 16)).collect() {
                Ok(b) => b,
                Err(_) => continue,
            },
        };
        if !bytes.is_empty() {
            out.insert(addr, (bytes, m.trim().to_string()));
        }
    }
    Some(out)
}

fn is_call(arch: CodeArch, mnemonic: &str) -> bool {
    let words: Vec<&str> = mnemonic.split_whitespace().collect();
    match arch {
        CodeArch::A64 => matches!(words.first(), Some(&("bl" | "blr" | "blraa" | "blraaz" | "blrab" | "blrabz"))),
        CodeArch::X86_64 => {
            // Skip prefixes objdump prints as words (notrack, bnd, data16, segment overrides).
            let m = words
                .iter()
                .find(|w| !matches!(**w, "notrack" | "bnd" | "data16" | "cs" | "ds" | "es" | "ss" | "rex" | "rex.W" | "rex.B"));
            m.is_some_and(|m| m.starts_with("call") || m.starts_with("lcall"))
        }
    }
}

/// (calls, calls accepted, other instructions, others accepted).
fn check(objdump: &str, file: &str, arch: CodeArch) -> Option<(u64, u64, u64, u64)> {
    let insns = disassemble(objdump, file, arch)?;
    let mut r = (0, 0, 0, 0);
    let mut window: Vec<u8> = Vec::new();
    let mut next = 0u64;
    for (&addr, (bytes, m)) in &insns {
        if addr != next {
            window.clear();
        }
        window.extend_from_slice(bytes);
        if window.len() > 32 {
            window.drain(..window.len() - 32);
        }
        next = addr + bytes.len() as u64;
        let ok = call_ends_at(arch, &window, next);
        if is_call(arch, m) {
            r.0 += 1;
            r.1 += u64::from(ok);
        } else {
            r.2 += 1;
            r.3 += u64::from(ok);
        }
    }
    Some(r)
}

#[test]
fn a64_return_addresses_match_objdump() {
    let Some((calls, ok, others, false_ok)) =
        check("aarch64-linux-gnu-objdump", "/usr/aarch64-linux-gnu/lib/libc.so.6", CodeArch::A64)
    else {
        return;
    };
    eprintln!("A64 libc: {calls} calls ({ok} accepted), {others} other instructions ({false_ok} accepted)");
    assert!(calls > 5_000, "{calls}");
    assert_eq!(ok, calls, "every call's return address is accepted");
    assert_eq!(false_ok, 0, "no other instruction is taken for a call");
}

#[test]
fn x86_64_return_addresses_match_objdump() {
    let mut total = (0, 0, 0, 0);
    for lib in ["/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"] {
        let Some((calls, ok, others, false_ok)) = check("objdump", lib, CodeArch::X86_64) else { return };
        eprintln!("x86-64 {lib}: {calls} calls ({ok} accepted), {others} other instructions ({false_ok} accepted)");
        assert_eq!(ok, calls, "{lib}: every call's return address is accepted");
        total = (total.0 + calls, total.1 + ok, total.2 + others, total.3 + false_ok);
    }
    assert!(total.0 > 10_000, "{total:?}");
    let rate = total.3 as f64 / total.2 as f64;
    assert!(rate < 0.02, "{:.2}% of non-call instruction ends pass as return addresses", 100.0 * rate);
}

/// The check in the one pipeline: a stack-only sample of a real x86-64 program whose third
/// frame is a function's entry (after no call, per objdump) keeps its leaf and first caller
/// under a `[truncated]` root, and is counted; the true stack is kept whole.
#[test]
fn pipeline_cuts_stacks_at_a_non_call_return() {
    use etm_session::session::PauseSample;
    use etm_session::{Pipeline, PipelineConfig, SessionEvent};
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("p.c");
    std::fs::write(
        &src,
        "__attribute__((noinline)) int leaf(int x) { return x * 3; }\n\
         __attribute__((noinline)) int mid(int x) { return leaf(x) + 1; }\n\
         int main(int c, char **v) { return mid(c); }\n",
    )
    .unwrap();
    let exe = d.path().join("p");
    let cc = Command::new("gcc").args(["-O1", "-no-pie", "-fno-inline", "-o"]).arg(&exe).arg(&src).status();
    if !cc.is_ok_and(|s| s.success()) {
        etm_testutil::skip("gcc cannot build the test program");
        return;
    }
    let insns = disassemble("objdump", exe.to_str().unwrap(), CodeArch::X86_64).unwrap();
    // The return address after the call to `target` (objdump names it `<target>`).
    let after_call = |target: &str| {
        insns
            .iter()
            .find(|(_, (_, m))| is_call(CodeArch::X86_64, m) && m.ends_with(&format!("<{target}>")))
            .map(|(a, (b, _))| a + b.len() as u64)
            .unwrap_or_else(|| panic!("no call to {target}"))
    };
    let sym = |name: &str| {
        let o = Command::new("nm").arg(&exe).output().unwrap();
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 3 && f[2] == name).then(|| u64::from_str_radix(f[0], 16).unwrap())
            })
            .unwrap()
    };
    let (ret_mid, ret_main, mid) = (after_call("leaf"), after_call("mid"), sym("mid"));
    // The instruction before `mid`'s entry is not a call (objdump's word for it).
    let before_mid = insns.range(..mid).next_back().unwrap();
    assert!(!is_call(CodeArch::X86_64, &before_mid.1.1), "{before_mid:?}");
    let mut p = Pipeline::new(PipelineConfig::default());
    p.add_image(exe.to_str().unwrap(), std::sync::Arc::new(std::fs::read(&exe).unwrap()));
    let leaf_pc = sym("leaf") + 1;
    // The second stack's third frame is an entry point, the third's a small integer (below
    // any user mapping), as frame-pointer walks through code without frame pointers read.
    for stack in [vec![leaf_pc, ret_mid, ret_main], vec![leaf_pc, ret_mid, mid, ret_main], vec![leaf_pc, ret_mid, 0x4d, ret_main]]
    {
        let s = PauseSample {
            cpu: 0,
            pid: 1,
            tid: 1,
            time: 1,
            stack,
            branches: None,
            branch_flags: Vec::new(),
            window_ns: None,
            user_stack: None,
        };
        p.push(SessionEvent::Sample(&s));
    }
    assert_eq!(p.stats().stacks_truncated, 2);
    let (trie, frames) = p.trie();
    let mut out = Vec::new();
    etm_stacks::folded::write_folded(trie, frames, &mut out).unwrap();
    let folded = String::from_utf8(out).unwrap();
    let mut lines: Vec<&str> = folded.lines().collect();
    lines.sort();
    assert_eq!(lines, ["[truncated];mid;leaf 2", "main;mid;leaf 1"], "{folded}");
}
