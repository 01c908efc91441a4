//! [`etm_decode::insn::a64_flow`] against LLVM's own AArch64 disassembler: every word of the
//! branch, exception and system classes that `llvm-objdump-22` decodes (all features on, its
//! default) is classified as its mnemonic says by the Arm ARM (`bl` a call, `blraa` an
//! indirect call, `retaa` a return, `cbgt` a conditional branch, `svc` an exception, ...).
//! The words: every register-branch form (opc, op2, op3, and Rn/Rm/op4 values), the
//! exception class, and random words of the immediate-branch and system classes. Words LLVM
//! does not decode (unallocated: they trap) are not compared.

use std::collections::BTreeMap;
use std::process::Command;

use etm_decode::insn::{Flow, a64_flow};

/// The class a mnemonic names (Arm ARM DDI 0487, C4.1.3 and C6 instruction pages).
fn truth(mnemonic: &str) -> Flow {
    match mnemonic {
        "bl" => Flow::Call,
        "blr" | "blraa" | "blraaz" | "blrab" | "blrabz" => Flow::IndirectCall,
        "b" => Flow::Jump,
        "br" | "braa" | "braaz" | "brab" | "brabz" => Flow::IndirectJump,
        "cbz" | "cbnz" | "tbz" | "tbnz" => Flow::CondBranch,
        m if m.starts_with("b.") || m.starts_with("bc.") => Flow::CondBranch,
        // FEAT_CMPBR: cb<cc>, cbb<cc>, cbh<cc> (and LLVM's aliases of them, all cb*).
        m if m.starts_with("cb") => Flow::CondBranch,
        "ret" | "retaa" | "retab" | "retaasppc" | "retabsppc" | "retaasppcr" | "retabsppcr" => Flow::Return,
        "eret" | "eretaa" | "eretab" | "drps" | "texit" => Flow::ExceptionReturn,
        "svc" | "hvc" | "smc" => Flow::Exception,
        "brk" | "hlt" | "dcps1" | "dcps2" | "dcps3" => Flow::Halt,
        _ => Flow::Other,
    }
}

fn words() -> Vec<u32> {
    let mut w = Vec::new();
    // Unconditional branch (register): 1101011 Z opc(4) op2(5) op3(6) Rn(5) op4(5).
    for z in 0..2u32 {
        for opc in 0..16u32 {
            for op3 in 0..64u32 {
                for (rn, op4) in [(0u32, 0u32), (30, 0), (31, 31), (17, 31), (5, 9), (31, 0)] {
                    w.push(0xD600_0000 | z << 24 | opc << 21 | 0x1F << 16 | op3 << 10 | rn << 5 | op4);
                }
            }
        }
    }
    // Exception generation: 11010100 opc(3) imm16 op2(3) LL(2).
    for opc in 0..8u32 {
        for low in 0..32u32 {
            w.push(0xD400_0000 | opc << 21 | 0x1234 << 5 | low);
        }
    }
    // System instructions that fall through: ISB, NOP, WFI, WFE, TSTART x0 and TCOMMIT (LLVM 22
    // has no FEAT_TME and lists these two as MRS/MSR: both fall through either way).
    w.extend([0xD503_3FDF, 0xD503_201F, 0xD503_207F, 0xD503_205F, 0xD523_3060, 0xD503_307F]);
    // Random words of the branch/exception/system space (bits 28:26 = 101), xorshift.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.push(((x as u32) & !0x1C00_0000) | 0x1400_0000);
    }
    w
}

#[test]
fn a64_flow_matches_llvm() {
    if Command::new("llvm-objdump-22").arg("--version").output().is_err()
        || Command::new("llvm-mc-22").arg("--version").output().is_err()
    {
        etm_testutil::skip("llvm-objdump-22 / llvm-mc-22 not installed (Debian llvm-22)");
        return;
    }
    let words = words();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("w.s");
    let obj = dir.path().join("w.o");
    let text: String = words.iter().map(|w| format!(".inst 0x{w:08x}\n")).collect();
    std::fs::write(&src, text).unwrap();
    let st = Command::new("llvm-mc-22").args(["-triple=aarch64", "-filetype=obj", "-o"]).arg(&obj).arg(&src).status().unwrap();
    assert!(st.success(), "llvm-mc-22");
    let out = Command::new("llvm-objdump-22").args(["-d", "--no-show-raw-insn"]).arg(&obj).output().unwrap();
    assert!(out.status.success(), "llvm-objdump-22: {}", String::from_utf8_lossy(&out.stderr));
    let mut mnemonic: BTreeMap<usize, String> = BTreeMap::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((addr, rest)) = l.trim_start().split_once(':') else { continue };
        let Ok(addr) = usize::from_str_radix(addr, 16) else { continue };
        let Some(m) = rest.split_whitespace().next() else { continue };
        mnemonic.insert(addr / 4, m.to_string());
    }
    let (mut compared, mut unknown) = (0, 0);
    let mut wrong = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (i, &w) in words.iter().enumerate() {
        let m = mnemonic.get(&i).unwrap_or_else(|| panic!("word {i} 0x{w:08x} not in the listing"));
        if m == "<unknown>" || m == "udf" {
            unknown += 1;
            continue;
        }
        compared += 1;
        *seen.entry(m.clone()).or_default() += 1;
        if a64_flow(w) != truth(m) {
            wrong.push(format!("0x{w:08x} {m}: ours {:?}, by its mnemonic {:?}", a64_flow(w), truth(m)));
        }
    }
    eprintln!("{compared} words compared, {unknown} unallocated; mnemonics: {seen:?}");
    assert!(wrong.is_empty(), "{} of {compared} differ:\n{}", wrong.len(), wrong[..wrong.len().min(40)].join("\n"));
    // The forms this must cover, each seen.
    for m in ["bl", "blr", "blraa", "blrabz", "b", "br", "braa", "ret", "retaa", "retab", "retaasppc", "eret", "eretaa", "drps"] {
        assert!(seen.contains_key(m), "{m} never generated");
    }
    for m in ["svc", "hvc", "brk", "hlt", "cbz", "tbnz", "cbgt", "bc.eq", "b.ne", "isb", "nop", "wfi", "wfe", "texit"] {
        assert!(seen.contains_key(m), "{m} never generated");
    }
}
