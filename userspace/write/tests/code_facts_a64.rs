//! The PGO writers' A64 code facts (`ElfCodeFacts`) against LLVM's disassembler on a program
//! built with pointer authentication (`-march=armv8.3-a -mbranch-protection=pac-ret`: its
//! non-leaf functions return with `retaa`), linked statically (so glibc's code, without
//! PAuth, is checked too): every instruction `llvm-objdump-22` lists in the function symbols
//! is a call, a return or a direct jump in the facts exactly when its mnemonic says so
//! (bl/blr/blra*; ret/reta*; b), as llvm-profgen's disassembler (the same LLVM) sees them.

use std::process::Command;

use etm_profile::CodeFacts;
use etm_write::elf::ElfCodeFacts;

/// 128 non-leaf functions (pac-ret signs and authenticates only those that save the link
/// register), called through a table.
fn source() -> String {
    let mut s =
        String::from("typedef int (*fn_t)(int);\n__attribute__((noinline)) static int leaf(int x) { return x * 3 + 1; }\n");
    for i in 0..128 {
        s += &format!("__attribute__((noinline)) static int f{i}(int x) {{ return leaf(x + {i}) ^ leaf(x); }}\n");
    }
    s += "static fn_t volatile table[128] = {";
    for i in 0..128 {
        s += &format!("f{i},");
    }
    s += "};\nint main(int argc, char **argv) {\n    (void)argv;\n    int acc = 0;\n    \
          for (int i = 0; i < argc * 100; i++) acc += table[i & 127](i);\n    return acc & 1;\n}\n";
    s
}

#[test]
fn pauth_returns_and_calls_as_llvm_lists_them() {
    let tools = ["aarch64-linux-gnu-gcc", "llvm-objdump-22"];
    if let Some(t) = tools.iter().find(|t| Command::new(t).arg("--version").output().is_err()) {
        etm_testutil::skip(format!("{t} not installed"));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (src, exe) = (dir.path().join("p.c"), dir.path().join("p"));
    std::fs::write(&src, source()).unwrap();
    let st = Command::new("aarch64-linux-gnu-gcc")
        .args(["-O2", "-march=armv8.3-a", "-mbranch-protection=pac-ret", "-static", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success(), "aarch64-linux-gnu-gcc");
    let facts = ElfCodeFacts::from_elf(&std::fs::read(&exe).unwrap()).unwrap();
    let out = Command::new("llvm-objdump-22").args(["-d", "--no-show-raw-insn"]).arg(&exe).output().unwrap();
    assert!(out.status.success());
    let (mut checked, mut retaa, mut wrong) = (0usize, 0usize, Vec::new());
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((addr, rest)) = l.trim_start().split_once(':') else { continue };
        let Ok(addr) = u64::from_str_radix(addr, 16) else { continue };
        let Some(m) = rest.split_whitespace().next() else { continue };
        // Only instructions inside function symbols are disassembled by llvm-profgen.
        if !facts.is_inst(addr) {
            continue;
        }
        checked += 1;
        retaa += usize::from(m == "retaa" || m == "retab");
        let call = matches!(m, "bl" | "blr" | "blraa" | "blraaz" | "blrab" | "blrabz");
        let ret = matches!(m, "ret" | "retaa" | "retab");
        let jump = m == "b";
        let got = (facts.is_call(addr), facts.is_return(addr), facts.range_crosses_uncond_branch(addr, addr + 1));
        if got != (call, ret, call || ret || jump) {
            wrong.push(format!("{addr:#x} {m}: call/return/uncond {got:?}"));
        }
    }
    eprintln!("{checked} instructions checked, {retaa} PAuth returns");
    assert!(checked > 10_000, "{checked} instructions in the static binary's functions");
    assert!(retaa > 100, "only {retaa} retaa/retab: the build did not use pointer authentication");
    assert!(wrong.is_empty(), "{} differ:\n{}", wrong.len(), wrong[..wrong.len().min(30)].join("\n"));
}
