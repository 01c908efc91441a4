//! A64 instruction classes that matter for instruction trace (ARM DDI 0487, C4.1 "A64
//! instruction set encoding": branches, exception generating and system instructions).
//!
//! This is written from the architecture's encoding tables, independently of the decoder in
//! `etm-decode`, so that the generator and the decoder can check each other.

/// What an instruction means for the trace: whether it is a P0 element (produces an atom) and
/// where it can go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsnClass {
    /// Not a branch: execution continues at `pc + 4`.
    Other,
    /// `B` or `BL` (`link`): always taken, to `target`.
    DirectUncond {
        /// Branch target.
        target: u64,
        /// `BL`.
        link: bool,
    },
    /// `B.cond`, `BC.cond`, `CBZ`/`CBNZ`, `TBZ`/`TBNZ`: taken to `target` or not taken.
    DirectCond {
        /// Branch target.
        target: u64,
    },
    /// `BR`, `BLR` (`link`), `RET` (`ret`) and their pointer-authentication forms.
    Indirect {
        /// `BLR`, `BLRAA`, ...
        link: bool,
        /// `RET`, `RETAA`, `RETAB`.
        ret: bool,
    },
    /// `ERET`/`ERETAA`/`ERETAB` (never executed at EL0).
    Eret,
    /// `SVC`, `HVC`, `SMC`: a synchronous exception ("call").
    ExceptionGen,
    /// `ISB`: a P0 instruction (E atom), ETMv4/ETE treat it as a waypoint.
    Isb,
    /// `WFI`/`WFE`/`WFIT`/`WFET`: a waypoint when TRCIDR2.WFXMODE is set.
    Wfx,
}

impl InsnClass {
    /// Whether the instruction is a P0 element (a "waypoint": it produces an atom), given
    /// whether WFI/WFE are waypoints (TRCIDR2 bit 31).
    pub fn is_waypoint(self, wfx_waypoint: bool) -> bool {
        match self {
            InsnClass::Other | InsnClass::ExceptionGen => false,
            InsnClass::Wfx => wfx_waypoint,
            _ => true,
        }
    }

    /// Whether it is a branch (direct or indirect, incl. `ERET`).
    pub fn is_branch(self) -> bool {
        matches!(
            self,
            InsnClass::DirectUncond { .. } | InsnClass::DirectCond { .. } | InsnClass::Indirect { .. } | InsnClass::Eret
        )
    }
}

fn sext(v: u32, bits: u32) -> i64 {
    let shift = 64 - bits;
    ((v as i64) << shift) >> shift
}

fn rel(pc: u64, imm: u32, bits: u32) -> u64 {
    pc.wrapping_add((sext(imm, bits) * 4) as u64)
}

/// Classify the A64 instruction word `insn` at address `pc`.
pub fn classify(insn: u32, pc: u64) -> InsnClass {
    // Unconditional branch (immediate): op 0 = B, 1 = BL; bits 30:26 = 0b00101.
    if insn & 0x7C00_0000 == 0x1400_0000 {
        return InsnClass::DirectUncond { target: rel(pc, insn & 0x03FF_FFFF, 26), link: insn >> 31 == 1 };
    }
    // Conditional branch (immediate): B.cond (bit4 = 0) and BC.cond (bit4 = 1), bit 24 = 0.
    if insn & 0xFF00_0000 == 0x5400_0000 {
        return InsnClass::DirectCond { target: rel(pc, (insn >> 5) & 0x7FFFF, 19) };
    }
    // Compare and branch (immediate): CBZ/CBNZ, bits 30:25 = 0b011010.
    if insn & 0x7E00_0000 == 0x3400_0000 {
        return InsnClass::DirectCond { target: rel(pc, (insn >> 5) & 0x7FFFF, 19) };
    }
    // Test and branch (immediate): TBZ/TBNZ, bits 30:25 = 0b011011.
    if insn & 0x7E00_0000 == 0x3600_0000 {
        return InsnClass::DirectCond { target: rel(pc, (insn >> 5) & 0x3FFF, 14) };
    }
    // Unconditional branch (register): 1101011 opc:4 op2:5=11111 op3:6 Rn op4.
    if insn >> 25 == 0x6B && (insn >> 16) & 0x1F == 0x1F {
        return match (insn >> 21) & 0xF {
            0b0000 | 0b1000 => InsnClass::Indirect { link: false, ret: false }, // BR, BRAA/BRAAZ...
            0b0001 | 0b1001 => InsnClass::Indirect { link: true, ret: false },  // BLR, BLRAA...
            0b0010 => InsnClass::Indirect { link: false, ret: true },           // RET, RETAA/RETAB
            0b0100 => InsnClass::Eret,                                          // ERET, ERETAA/AB
            _ => InsnClass::Other,                                              // DRPS, unallocated
        };
    }
    // Exception generation: 11010100 opc:3 imm16 op2:3 LL:2; SVC/HVC/SMC have opc = 000.
    if insn & 0xFFE0_001C == 0xD400_0000 && insn & 3 != 0 {
        return InsnClass::ExceptionGen;
    }
    // Barriers: ISB = 1101 0101 0000 0011 0011 CRm 110 11111.
    if insn & 0xFFFF_F0FF == 0xD503_30DF {
        return InsnClass::Isb;
    }
    // Hints: WFE (CRm=0000, op2=010), WFI (op2=011).
    if insn == 0xD503_205F || insn == 0xD503_207F {
        return InsnClass::Wfx;
    }
    // WFET/WFIT: 1101 0101 0000 0011 0001 0000 op2:3 Rd, op2 = 000 (WFET) / 001 (WFIT).
    if insn & 0xFFFF_FFC0 == 0xD503_1000 {
        return InsnClass::Wfx;
    }
    InsnClass::Other
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Encodings assembled by hand from the Arm ARM tables (and checked with
    /// `aarch64-linux-gnu-objdump` on the test programs) classify to the right kinds.
    #[test]
    fn classifies_branch_kinds() {
        // b .+8 ; bl .-4
        assert_eq!(classify(0x1400_0002, 0x1000), InsnClass::DirectUncond { target: 0x1008, link: false });
        assert_eq!(classify(0x97FF_FFFF, 0x1000), InsnClass::DirectUncond { target: 0xFFC, link: true });
        // b.ne .+0x10 (cond = 0001) ; cbz x0, .-8 ; tbnz w1, #3, .+0x20
        assert_eq!(classify(0x5400_0081, 0x2000), InsnClass::DirectCond { target: 0x2010 });
        assert_eq!(classify(0xB4FF_FFC0, 0x2000), InsnClass::DirectCond { target: 0x1FF8 });
        assert_eq!(classify(0x3718_0101, 0x2000), InsnClass::DirectCond { target: 0x2020 });
        // br x16 ; blr x3 ; ret ; retaa ; blraaz x1
        assert_eq!(classify(0xD61F_0200, 0), InsnClass::Indirect { link: false, ret: false });
        assert_eq!(classify(0xD63F_0060, 0), InsnClass::Indirect { link: true, ret: false });
        assert_eq!(classify(0xD65F_03C0, 0), InsnClass::Indirect { link: false, ret: true });
        assert_eq!(classify(0xD65F_0BFF, 0), InsnClass::Indirect { link: false, ret: true });
        assert_eq!(classify(0xD63F_083F, 0), InsnClass::Indirect { link: true, ret: false });
        // eret ; svc #0 ; isb ; wfi ; nop ; add x0, x0, #1
        assert_eq!(classify(0xD69F_03E0, 0), InsnClass::Eret);
        assert_eq!(classify(0xD400_0001, 0), InsnClass::ExceptionGen);
        assert_eq!(classify(0xD503_3FDF, 0), InsnClass::Isb);
        assert_eq!(classify(0xD503_207F, 0), InsnClass::Wfx);
        assert_eq!(classify(0xD503_201F, 0), InsnClass::Other);
        assert_eq!(classify(0x9100_0400, 0), InsnClass::Other);
        // brk #0 is an exception but not a call (debug): not ExceptionGen here.
        assert_eq!(classify(0xD420_0000, 0), InsnClass::Other);
    }
}
