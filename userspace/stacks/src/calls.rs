//! Is a return address really one? The instruction before a return address must be a call:
//! a frame-pointer walk through code built without frame pointers reads saved registers or
//! data as return addresses, and the callers it invents (`_int_free <- [vdso]`) are worse than
//! a short stack. Callers cut a stack at the first return address that fails the check.
//!
//! * A64: the word before is `BL` (`100101 imm26`), `BLR`, or a PAuth form (`BLRAA`,
//!   `BLRAAZ`, `BLRAB`, `BLRABZ`): "Branch with Link" instructions of the Arm ARM (C6.2), the
//!   ones that write the return address to X30.
//! * x86-64: some call instruction of the bytes before ends exactly at the return address
//!   (`E8 rel32`, `FF /2` with every ModRM form, with prefixes such as REX, `notrack` or
//!   segment overrides; far calls `FF /3`), found by decoding each suffix of up to 15 bytes
//!   with iced-x86. Any call that really precedes the address is found; a suffix that happens
//!   to decode as a call is accepted too (the check never cuts a real stack).

use iced_x86::{Decoder, DecoderOptions, FlowControl};

/// The architecture of the code a return address points into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CodeArch {
    A64,
    X86_64,
}

impl CodeArch {
    /// From an ELF file's `e_machine` (`None`: another architecture, or not ELF).
    pub fn of_elf(data: &[u8]) -> Option<CodeArch> {
        use object::Object;
        match object::File::parse(data).ok()?.architecture() {
            object::Architecture::Aarch64 => Some(CodeArch::A64),
            object::Architecture::X86_64 => Some(CodeArch::X86_64),
            _ => None,
        }
    }

    /// Bytes before a return address the check needs.
    pub fn max_call_len(self) -> usize {
        match self {
            CodeArch::A64 => 4,
            CodeArch::X86_64 => 15,
        }
    }
}

/// Whether an A64 instruction is a branch with link.
pub fn a64_is_call(inst: u32) -> bool {
    // BL imm26; BLR/BLRAAZ/BLRABZ (D63F....) and BLRAA/BLRAB (D73F....): unconditional branch
    // (register) with opc<0> = 1 and op2 = 11111.
    inst & 0xFC00_0000 == 0x9400_0000 || inst & 0xFEFF_0000 == 0xD63F_0000
}

/// Whether the code ending at a return address (`before`: the bytes just before it, at most
/// [`CodeArch::max_call_len`] used) ends in a call. `ret` is the return address (for x86 RIP-relative
/// forms; the outcome does not depend on it).
pub fn call_ends_at(arch: CodeArch, before: &[u8], ret: u64) -> bool {
    match arch {
        CodeArch::A64 => {
            let Some(w) = before.len().checked_sub(4).map(|i| &before[i..]) else { return false };
            a64_is_call(u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        }
        CodeArch::X86_64 => {
            let n = before.len().min(15);
            // Shortest first: `call reg` (2 bytes) and `call rel32` (5) are the common ones.
            (2..=n).any(|len| {
                let bytes = &before[before.len() - len..];
                let mut d = Decoder::with_ip(64, bytes, ret - len as u64, DecoderOptions::NONE);
                let i = d.decode();
                !i.is_invalid() && i.len() == len && matches!(i.flow_control(), FlowControl::Call | FlowControl::IndirectCall)
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x86(bytes: &[u8]) -> bool {
        // Some unrelated code before the instruction, as in a real function.
        let mut v = vec![0x48, 0x89, 0xe5, 0x31, 0xc0, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90];
        v.extend_from_slice(bytes);
        call_ends_at(CodeArch::X86_64, &v, 0x40_1000)
    }

    /// The call encodings (Intel SDM Vol. 2A "CALL"), with and without prefixes.
    #[test]
    fn x86_calls() {
        assert!(x86(&[0xe8, 0x10, 0x20, 0x00, 0x00])); // call rel32
        assert!(x86(&[0xff, 0xd0])); // call *%rax
        assert!(x86(&[0x41, 0xff, 0xd3])); // call *%r11
        assert!(x86(&[0xff, 0x15, 0x00, 0x10, 0x00, 0x00])); // call *disp32(%rip)
        assert!(x86(&[0xff, 0x54, 0x24, 0x08])); // call *0x8(%rsp)
        assert!(x86(&[0xff, 0x50, 0x10])); // call *0x10(%rax)
        assert!(x86(&[0x41, 0xff, 0x94, 0xc4, 0x00, 0x01, 0x00, 0x00])); // call *0x100(%r12,%rax,8)
        assert!(x86(&[0x3e, 0xff, 0xd0])); // notrack call *%rax
        assert!(x86(&[0xff, 0x1c, 0x24])); // lcall *(%rsp)
        // Not calls: ret, jmp rel32, jmp *%rax, mov, nop, push.
        assert!(!x86(&[0xc3]));
        assert!(!x86(&[0xe9, 0x10, 0x20, 0x00, 0x00]));
        assert!(!x86(&[0xff, 0xe0]));
        assert!(!x86(&[0x48, 0x89, 0xc7]));
        assert!(!x86(&[0x0f, 0x1f, 0x44, 0x00, 0x00]));
        assert!(!x86(&[0x55]));
        assert!(!call_ends_at(CodeArch::X86_64, &[], 0x1000));
        assert!(!call_ends_at(CodeArch::X86_64, &[0xd0], 0x1000));
    }

    /// BL, BLR and the PAuth forms (Arm ARM C6.2.34-C6.2.38); B, BR, RET, BRAA are not.
    #[test]
    fn a64_calls() {
        let w = |i: u32| call_ends_at(CodeArch::A64, &i.to_le_bytes(), 0x1000);
        assert!(w(0x9400_0010)); // bl +0x40
        assert!(w(0x97ff_fff0)); // bl -0x40
        assert!(w(0xd63f_0100)); // blr x8
        assert!(w(0xd63f_091f)); // blraaz x8
        assert!(w(0xd63f_0d1f)); // blrabz x8
        assert!(w(0xd73f_0910)); // blraa x8, x16
        assert!(w(0xd73f_0d10)); // blrab x8, x16
        assert!(!w(0x1400_0010)); // b
        assert!(!w(0xd61f_0100)); // br x8
        assert!(!w(0xd65f_03c0)); // ret
        assert!(!w(0xd71f_0910)); // braa x8, x16
        assert!(!w(0xd503_201f)); // nop
        assert!(!call_ends_at(CodeArch::A64, &[0x10, 0x00, 0x00], 0x1000));
    }
}
