//! Per-architecture code facts for the join's checks, and the kernel's branch-entry flags.
//!
//! * A64: fixed 4-byte words ([`a64_kind`]).
//! * x86-64: variable-length instructions, decoded with iced-x86 ([`x86_decode`]); a walk
//!   must land on the next branch source (or the leaf) exactly, and "a return lands after a
//!   call" means some call instruction ends at the return target ([`x86_after_call`]).
//! * [`BranchFlags`]: the flag word of the kernel's `struct perf_branch_entry`
//!   (`include/uapi/linux/perf_event.h`), as `bpf_read_branch_records` copies it.

pub use crate::join::InsnKind;

/// A64 instruction kind for validation: the one A64 classification
/// ([`etm_decode::insn::a64_flow`], PAuth and FEAT_CMPBR forms included) in the join's terms.
pub fn a64_kind(inst: u32) -> InsnKind {
    use etm_decode::insn::{Flow, a64_flow};
    match a64_flow(inst) {
        Flow::Other => InsnKind::Other,
        Flow::Call | Flow::IndirectCall => InsnKind::Call,
        Flow::Jump | Flow::IndirectJump => InsnKind::Jump,
        Flow::CondBranch => InsnKind::CondBranch,
        Flow::Return => InsnKind::Return,
        Flow::Exception => InsnKind::Exception,
        Flow::ExceptionReturn | Flow::Halt => InsnKind::Flow,
    }
}

/// Longest x86 instruction.
pub const X86_MAX_INSN: usize = 15;

/// The x86-64 instruction at the start of `code` (at runtime address `ip`): its kind and
/// length; `None` if the bytes are no valid instruction (or too few).
pub fn x86_decode(code: &[u8], ip: u64) -> Option<(InsnKind, u64)> {
    use iced_x86::{Code, Decoder, DecoderOptions, FlowControl, Mnemonic};
    let code = &code[..code.len().min(X86_MAX_INSN)];
    let mut d = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    if !d.can_decode() {
        return None;
    }
    let ins = d.decode();
    if ins.code() == Code::INVALID {
        return None;
    }
    let kind = match ins.flow_control() {
        FlowControl::Next | FlowControl::XbeginXabortXend => InsnKind::Other,
        FlowControl::ConditionalBranch => InsnKind::CondBranch,
        FlowControl::UnconditionalBranch | FlowControl::IndirectBranch => InsnKind::Jump,
        // SYSCALL/SYSENTER are "calls" to iced; user execution resumes after them.
        FlowControl::Call | FlowControl::IndirectCall if matches!(ins.mnemonic(), Mnemonic::Syscall | Mnemonic::Sysenter) => {
            InsnKind::Exception
        }
        FlowControl::Call | FlowControl::IndirectCall => InsnKind::Call,
        FlowControl::Return => InsnKind::Return,
        // INT n returns after itself (INT3 traps to a debugger, but resumes there too).
        FlowControl::Interrupt => InsnKind::Exception,
        FlowControl::Exception => InsnKind::Flow,
    };
    Some((kind, ins.len() as u64))
}

/// Whether some call instruction ends exactly at `addr`, given `before` = the up to
/// [`X86_MAX_INSN`] bytes that precede `addr` (the last byte is at `addr - 1`). x86 cannot be
/// decoded backwards; every start that would end at `addr` is tried.
pub fn x86_after_call(before: &[u8], addr: u64) -> bool {
    (2..=before.len().min(X86_MAX_INSN)).any(|k| {
        let start = before.len() - k;
        matches!(x86_decode(&before[start..], addr - k as u64), Some((InsnKind::Call, len)) if len == k as u64)
    })
}

/// The flag word of a `struct perf_branch_entry` (bit order of the uapi bitfield on
/// little-endian targets: mispred 0, predicted 1, in_tx 2, abort 3, cycles 4..19, type
/// 20..23, spec 24..25, new_type 26..29, priv 30..32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BranchFlags(pub u64);

/// `PERF_BR_*` branch types (`include/uapi/linux/perf_event.h`) the checks use.
pub mod br_type {
    pub const UNKNOWN: u8 = 0;
    pub const COND: u8 = 1;
    pub const UNCOND: u8 = 2;
    pub const IND: u8 = 3;
    pub const CALL: u8 = 4;
    pub const IND_CALL: u8 = 5;
    pub const RET: u8 = 6;
    pub const SYSCALL: u8 = 7;
    pub const SYSRET: u8 = 8;
    pub const COND_CALL: u8 = 9;
    pub const COND_RET: u8 = 10;
    pub const ERET: u8 = 11;
    pub const IRQ: u8 = 12;
}

/// `PERF_BR_SPEC_WRONG_PATH`.
pub const PERF_BR_SPEC_WRONG_PATH: u8 = 1;

impl BranchFlags {
    /// `abort`: the entry records a transaction abort (Intel TSX), not a branch.
    pub fn abort(self) -> bool {
        self.0 & (1 << 3) != 0
    }
    /// `in_tx`.
    pub fn in_tx(self) -> bool {
        self.0 & (1 << 2) != 0
    }
    /// `type` (`PERF_BR_*`; 0 = unknown, e.g. legacy LBR without TYPE_SAVE).
    pub fn ty(self) -> u8 {
        ((self.0 >> 20) & 0xf) as u8
    }
    /// `spec` (`PERF_BR_SPEC_*`; 0 = not available).
    pub fn spec(self) -> u8 {
        ((self.0 >> 24) & 0x3) as u8
    }
    /// The entry records a branch taken on a wrong speculative path (AMD LBRv2:
    /// `amd_pmu_lbr_read` keeps them, with `spec = PERF_BR_SPEC_WRONG_PATH`).
    pub fn wrong_path(self) -> bool {
        self.spec() == PERF_BR_SPEC_WRONG_PATH
    }
    /// What the type says the branch was, if it says (calls and returns only matter).
    pub fn kind(self) -> Option<InsnKind> {
        match self.ty() {
            br_type::CALL | br_type::IND_CALL | br_type::COND_CALL => Some(InsnKind::Call),
            br_type::RET | br_type::COND_RET => Some(InsnKind::Return),
            br_type::COND => Some(InsnKind::CondBranch),
            br_type::UNCOND | br_type::IND => Some(InsnKind::Jump),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The A64 classifier recognises the branch classes the validation relies on.
    #[test]
    fn a64_classes() {
        // Encodings from the Arm ARM (checked against `aarch64-linux-gnu-objdump`).
        assert_eq!(a64_kind(0x9400_0010), InsnKind::Call); // bl
        assert_eq!(a64_kind(0x1400_0010), InsnKind::Jump); // b
        assert_eq!(a64_kind(0xD63F_0020), InsnKind::Call); // blr x1
        assert_eq!(a64_kind(0xD61F_0020), InsnKind::Jump); // br x1
        assert_eq!(a64_kind(0xD65F_03C0), InsnKind::Return); // ret
        assert_eq!(a64_kind(0x5400_0040), InsnKind::CondBranch); // b.eq
        assert_eq!(a64_kind(0xB400_0040), InsnKind::CondBranch); // cbz x0
        assert_eq!(a64_kind(0x3600_0040), InsnKind::CondBranch); // tbz w0
        assert_eq!(a64_kind(0xD400_0001), InsnKind::Exception); // svc #0
        assert_eq!(a64_kind(0xD420_0000), InsnKind::Flow); // brk #0
        assert_eq!(a64_kind(0x8B02_0020), InsnKind::Other); // add x0, x1, x2
        assert_eq!(a64_kind(0xD503_201F), InsnKind::Other); // nop
    }

    /// x86-64 encodings (Intel SDM vol. 2) classify with their lengths.
    #[test]
    fn x86_classes() {
        let k = |b: &[u8]| x86_decode(b, 0x1000);
        assert_eq!(k(&[0xe8, 0, 0, 0, 0]), Some((InsnKind::Call, 5))); // call rel32
        assert_eq!(k(&[0xff, 0xd0]), Some((InsnKind::Call, 2))); // call rax
        assert_eq!(k(&[0x41, 0xff, 0x54, 0x24, 0x08]), Some((InsnKind::Call, 5))); // call [r12+8]
        assert_eq!(k(&[0xc3]), Some((InsnKind::Return, 1))); // ret
        assert_eq!(k(&[0xeb, 0x10]), Some((InsnKind::Jump, 2))); // jmp rel8
        assert_eq!(k(&[0xff, 0xe0]), Some((InsnKind::Jump, 2))); // jmp rax
        assert_eq!(k(&[0x74, 0x02]), Some((InsnKind::CondBranch, 2))); // je
        assert_eq!(k(&[0x0f, 0x05]), Some((InsnKind::Exception, 2))); // syscall
        assert_eq!(k(&[0x0f, 0x0b]), Some((InsnKind::Flow, 2))); // ud2
        assert_eq!(k(&[0x48, 0x89, 0xc3]), Some((InsnKind::Other, 3))); // mov rbx, rax
        assert_eq!(k(&[0x48]), None);
    }

    /// A call ending at the address is found whatever its length; other code is not one.
    #[test]
    fn x86_call_before() {
        // mov rbx, rax; call rel32 -> ends at 0x1008.
        let code = [0x48, 0x89, 0xc3, 0xe8, 1, 2, 3, 4];
        assert!(x86_after_call(&code, 0x1008));
        // nop; nop; call rax.
        assert!(x86_after_call(&[0x90, 0x90, 0xff, 0xd0], 0x1004));
        assert!(!x86_after_call(&[0x90, 0x90, 0x48, 0x89, 0xc3], 0x1005));
    }

    /// The flag word's fields at the uapi bit positions.
    #[test]
    fn branch_flag_fields() {
        let f = BranchFlags((1 << 3) | (u64::from(br_type::RET) << 20) | (1 << 24));
        assert!(f.abort() && f.wrong_path());
        assert_eq!(f.kind(), Some(InsnKind::Return));
        assert_eq!(BranchFlags(u64::from(br_type::IND_CALL) << 20).kind(), Some(InsnKind::Call));
        assert_eq!(BranchFlags(3 << 24).spec(), 3);
        assert!(!BranchFlags(3 << 24).wrong_path());
        assert_eq!(BranchFlags(0).kind(), None);
    }

    fn x86(bytes: &[u8]) -> bool {
        // Some unrelated code before the instruction, as in a real function.
        let mut v = vec![0x48, 0x89, 0xe5, 0x31, 0xc0, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90];
        v.extend_from_slice(bytes);
        x86_after_call(&v[v.len().saturating_sub(X86_MAX_INSN)..], 0x40_1000)
    }

    /// The call encodings (Intel SDM Vol. 2A "CALL"), with and without prefixes.
    #[test]
    fn x86_call_encodings() {
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
        assert!(!x86_after_call(&[], 0x1000));
        assert!(!x86_after_call(&[0xd0], 0x1000));
        assert!(!x86(&[0x0f, 0x05])); // syscall: user code resumes after it, but it is no call
    }

    /// BL, BLR and the PAuth forms (Arm ARM C6.2.34-C6.2.38); B, BR, RET, BRAA are not.
    #[test]
    fn a64_branch_with_link_forms() {
        let w = |i: u32| a64_kind(i) == InsnKind::Call;
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
    }
}
