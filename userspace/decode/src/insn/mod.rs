//! Instruction classification for trace decode: which instructions are P0 waypoints
//! (branches, ISB, optionally WFI/WFE and TSTART), their branch targets, and the
//! type/sub-type OpenCSD reports in `OCSD_GEN_TRC_ELEM_INSTR_RANGE` lines.
//!
//! ETMv4 (IHI 0064, section 4.1 "Waypoints" / P0 instructions) and ETE (DDI 0608, section
//! "P0 instructions") define a waypoint as any branch (direct or indirect, including exception
//! returns), plus ISB, and WFI/WFE when TRCIDR2.WFXMODE is set (ETMv4.3+). The exact encodings
//! and sub-types follow OpenCSD's `trc_idec_arminst.cpp` so that decoded ranges are identical to
//! OpenCSD's: BL/BLR* are "branch with link", RET* are "A64:ret", ERET*/TEXIT are "A64:eret",
//! and A32/T32 `BX LR`, `POP {..,pc}`, `MOV pc,lr`, `LDR pc,[sp],#` are "V7:impl ret".
//!
//! A64 is complete (B, BL, B.cond, BC.cond, CBZ/CBNZ, TBZ/TBNZ, FEAT_CMPBR CB<cc>/CBB/CBH,
//! BR/BLR/RET, the FEAT_PAuth forms BRA*/BLRA*/RETA*/ERETA*, FEAT_PAuth_LR RETA*SPPC, TEXIT,
//! ISB, WFI/WFE/WFIT/WFET, TSTART). A32 and T32 (including IT blocks and the Armv8.1-M
//! low-overhead-loop branches LE/LETP/WLS/WLSTP) cover what the captures need.

mod a32;
mod a64;
mod flow;
mod t32;

pub use a64::decode_a64;
pub use flow::{Flow, a64_flow};

/// Instruction set of a traced instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Isa {
    /// A32 (Arm).
    Arm,
    /// T32 (Thumb-2).
    Thumb2,
    /// A64.
    #[default]
    A64,
    /// Unknown / not yet set.
    Unknown,
}

impl Isa {
    /// The name OpenCSD prints (`ISA=A64`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Arm => "A32",
            Isa::Thumb2 => "T32",
            Isa::A64 => "A64",
            Isa::Unknown => "Unk",
        }
    }
}

/// Class of an instruction for trace purposes (`ocsd_instr_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum InstrType {
    /// Not a waypoint.
    #[default]
    Other,
    /// Direct branch (target computable from the opcode).
    Br,
    /// Indirect branch (target comes from the trace).
    BrIndirect,
    /// ISB barrier (always a waypoint).
    Isb,
    /// DSB/DMB (waypoint only if configured; never here).
    DsbDmb,
    /// WFI/WFE (waypoint if TRCIDR2.WFXMODE).
    WfiWfe,
    /// TSTART (FEAT_TME).
    Tstart,
}

impl InstrType {
    /// OpenCSD's printed name, including its trailing padding.
    pub fn name(self) -> &'static str {
        match self {
            InstrType::Other => "--- ",
            InstrType::Br => "BR  ",
            InstrType::BrIndirect => "iBR ",
            InstrType::Isb => "ISB ",
            InstrType::DsbDmb => "DSB.DMB",
            InstrType::WfiWfe => "WFI.WFE",
            InstrType::Tstart => "TSTART",
        }
    }
}

/// Sub-type of a branch (`ocsd_instr_subtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum InstrSubtype {
    /// Plain.
    #[default]
    None,
    /// Branch with link (call).
    BrLink,
    /// A64 RET family.
    V8Ret,
    /// A64 ERET family (also TEXIT).
    V8Eret,
    /// A32/T32 instruction that implies a return (BX LR, POP {pc}, ...).
    V7ImpliedRet,
}

impl InstrSubtype {
    /// OpenCSD's printed name (empty for `None`).
    pub fn name(self) -> &'static str {
        match self {
            InstrSubtype::None => "",
            InstrSubtype::BrLink => "b+link ",
            InstrSubtype::V8Ret => "A64:ret ",
            InstrSubtype::V8Eret => "A64:eret ",
            InstrSubtype::V7ImpliedRet => "V7:impl ret",
        }
    }
}

/// Architecture version of the traced core (gates FEAT_PAuth, WFxT, TME decoding as OpenCSD does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum ArchVersion {
    /// Armv7.
    V7,
    /// Armv8.0.
    V8,
    /// Armv8.3 (pointer authentication).
    V8r3,
    /// Latest AArch64 (`ARM-AA64`, Armv9): everything enabled.
    #[default]
    Aa64,
}

impl ArchVersion {
    /// Architecture of a snapshot core type name (OpenCSD `CoreArchProfileMap`).
    pub fn of_core_type(name: &str) -> ArchVersion {
        let v8 = ["Cortex-A53", "Cortex-A57", "Cortex-A72", "Cortex-A73", "Cortex-A35", "Cortex-A32"];
        let v8r3 = ["Cortex-A55", "Cortex-A65", "Cortex-A75", "Cortex-A76", "Cortex-A77"];
        let v7 = [
            "Cortex-A15",
            "Cortex-A7",
            "Cortex-A9",
            "Cortex-A17",
            "Cortex-A5",
            "Cortex-A8",
            "Cortex-R4",
            "Cortex-R5",
            "Cortex-R7",
            "Cortex-M0",
            "Cortex-M0+",
            "Cortex-M3",
            "Cortex-M4",
        ];
        if v8.contains(&name) || name.starts_with("ARMv8") || name.starts_with("Cortex-M") {
            ArchVersion::V8
        } else if v8r3.contains(&name) {
            ArchVersion::V8r3
        } else if v7.contains(&name) || name.starts_with("ARMv7") {
            ArchVersion::V7
        } else {
            ArchVersion::Aa64
        }
    }
}

/// Static decode options (from the trace unit configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DecodeConfig {
    /// Core architecture version.
    pub arch: ArchVersion,
    /// WFI/WFE are waypoints (TRCIDR2.WFXMODE, ETMv4.3+).
    pub wfi_wfe_branch: bool,
    /// DSB/DMB are waypoints (never set by ETMv4/ETE; kept for completeness).
    pub dsb_dmb_waypoints: bool,
}

/// Result of classifying one instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InstrInfo {
    /// Waypoint class.
    pub ty: InstrType,
    /// Branch sub-type.
    pub subtype: InstrSubtype,
    /// Size in bytes (2 or 4).
    pub size: u8,
    /// Branch with link.
    pub is_link: bool,
    /// Conditional (B.cond, CBZ, in an IT block, ...).
    pub is_cond: bool,
    /// Direct branch target.
    pub branch_addr: u64,
    /// ISA after a taken branch (BLX switches A32 <-> T32).
    pub next_isa: Isa,
}

/// Per-decoder T32 IT-block state (instructions left in the current IT block).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ItState {
    /// Remaining conditional instructions of the IT block.
    pub remaining: u8,
}

/// Classifies the instruction `opcode` (the 4 little-endian bytes at `addr`) in `isa`.
/// For T32, the first halfword is in the low 16 bits of `opcode` as read from memory.
pub fn decode(isa: Isa, addr: u64, opcode: u32, cfg: &DecodeConfig, it: &mut ItState) -> InstrInfo {
    match isa {
        Isa::A64 | Isa::Unknown => decode_a64(addr, opcode, cfg),
        Isa::Arm => a32::decode_a32(addr, opcode, cfg),
        Isa::Thumb2 => t32::decode_t32(addr, opcode, cfg, it),
    }
}

/// True if the first T32 halfword starts a 32-bit instruction.
#[inline]
pub fn is_wide_thumb(hw: u16) -> bool {
    (hw & 0xF800) >= 0xE800
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Core-type names map to the architecture gates OpenCSD applies.
    #[test]
    fn arch_of_core_names() {
        assert_eq!(ArchVersion::of_core_type("Cortex-A53"), ArchVersion::V8);
        assert_eq!(ArchVersion::of_core_type("Cortex-A55"), ArchVersion::V8r3);
        assert_eq!(ArchVersion::of_core_type("ARM-AA64"), ArchVersion::Aa64);
        assert_eq!(ArchVersion::of_core_type("Cortex-M55"), ArchVersion::V8);
    }
}
