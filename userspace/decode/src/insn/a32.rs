//! A32 waypoint classification (Arm ARM DDI 0487 F4 "A32 instruction set encoding"),
//! following OpenCSD's `inst_ARM_*` rules.

use super::{DecodeConfig, InstrInfo, InstrSubtype, InstrType, Isa};

fn is_indirect(inst: u32, sub: &mut InstrSubtype) -> bool {
    if inst & 0xF000_0000 == 0xF000_0000 {
        return inst & 0xFE50_0000 == 0xF810_0000; // RFE
    }
    if inst & 0x0FF0_00D0 == 0x0120_0010 {
        if inst & 0xFF == 0x1E {
            *sub = InstrSubtype::V7ImpliedRet; // BX LR
        }
        return true; // BX, BLX (register)
    }
    if inst & 0x0FF0_00F0 == 0x0120_0020 {
        return true; // BXJ
    }
    if inst & 0x0E10_8000 == 0x0810_8000 {
        if inst & 0x0FFF_A000 == 0x08BD_8000 {
            *sub = InstrSubtype::V7ImpliedRet; // LDMIA sp!, {..,pc}
        }
        return true;
    }
    if inst & 0x0E50_F000 == 0x0410_F000 {
        if inst & 0x01FF_0000 == 0x009D_0000 {
            *sub = InstrSubtype::V7ImpliedRet; // LDR pc, [sp], #imm
        }
        return true;
    }
    if inst & 0x0E50_F010 == 0x0610_F000 {
        return true; // LDR pc, reg
    }
    if inst & 0x0FE0_F000 == 0x01A0_F000 {
        if inst & 0x0010_0FFF == 0x00E {
            *sub = InstrSubtype::V7ImpliedRet; // MOV pc, lr
        }
        return true;
    }
    if inst & 0x0F90_0080 == 0x0100_0000 || inst & 0x0F90_00F0 == 0x0180_0090 || inst & 0x0FB0_F000 == 0x0320_F000 {
        return false; // misc, extended load/store, MSR imm
    }
    if inst & 0x0E00_F000 == 0x0200_F000 {
        return inst & 0x0F90_F000 != 0x0310_F000; // DP pc, imm (not TST/CMP)
    }
    inst & 0x0E00_F000 == 0x0000_F000 // DP pc, reg
}

fn is_direct(inst: u32) -> bool {
    if inst & 0xF000_0000 == 0xF000_0000 {
        inst & 0xFE00_0000 == 0xFA00_0000 // BLX (imm)
    } else {
        inst & 0x0E00_0000 == 0x0A00_0000 // B, BL
    }
}

fn is_link(inst: u32) -> bool {
    (inst & 0xF000_0000 == 0xF000_0000 && inst & 0xFE00_0000 == 0xFA00_0000)
        || inst & 0x0F00_0000 == 0x0B00_0000
        || inst & 0x0FF0_00F0 == 0x0120_0030
}

/// Classifies one A32 instruction.
pub fn decode_a32(addr: u64, inst: u32, cfg: &DecodeConfig) -> InstrInfo {
    let mut info = InstrInfo { size: 4, next_isa: Isa::Arm, ..InstrInfo::default() };
    let mut sub = InstrSubtype::None;
    if is_indirect(inst, &mut sub) {
        info.ty = InstrType::BrIndirect;
        info.is_link = is_link(inst);
        if info.is_link {
            sub = InstrSubtype::BrLink;
        }
    } else if is_direct(inst) {
        info.ty = InstrType::Br;
        let mut npc = (addr as u32).wrapping_add(8).wrapping_add((((inst & 0x00FF_FFFF) << 8) as i32 >> 6) as u32);
        if inst & 0xF000_0000 == 0xF000_0000 {
            npc |= 1 | ((inst >> 23) & 2);
        }
        if npc & 1 != 0 {
            info.next_isa = Isa::Thumb2;
            npc &= !1;
        }
        info.branch_addr = npc as u64;
        info.is_link = is_link(inst);
        if info.is_link {
            sub = InstrSubtype::BrLink;
        }
    } else if inst & 0xFFF0_0000 == 0xF570_0000 {
        match inst & 0xF0 {
            0x60 => info.ty = InstrType::Isb,
            0x40 | 0x50 if cfg.dsb_dmb_waypoints => info.ty = InstrType::DsbDmb,
            _ => {}
        }
    } else if inst & 0x0FFF_0F00 == 0x0E07_0F00 {
        match inst & 0xFF {
            0x95 => info.ty = InstrType::Isb,
            0x9A | 0xBA if cfg.dsb_dmb_waypoints => info.ty = InstrType::DsbDmb,
            _ => {}
        }
    } else if cfg.wfi_wfe_branch && inst & 0xF000_0000 != 0xF000_0000 && inst & 0x0FFF_FFFE == 0x0320_F002 {
        info.ty = InstrType::WfiWfe;
    }
    info.subtype = sub;
    info.is_cond = inst & 0xE000_0000 != 0xE000_0000;
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A32 BL and BX LR classify as call and implied return.
    #[test]
    fn a32_bl_bx() {
        let cfg = DecodeConfig::default();
        let bl = decode_a32(0x8000, 0xEB00_0002, &cfg); // bl +8 -> 0x8000+8+8
        assert_eq!((bl.ty, bl.subtype, bl.branch_addr), (InstrType::Br, InstrSubtype::BrLink, 0x8010));
        let bx = decode_a32(0x8000, 0xE12F_FF1E, &cfg);
        assert_eq!((bx.ty, bx.subtype), (InstrType::BrIndirect, InstrSubtype::V7ImpliedRet));
        let blx = decode_a32(0x8000, 0xFA00_0000, &cfg); // blx to Thumb
        assert_eq!(blx.next_isa, Isa::Thumb2);
    }
}
