//! A64 waypoint classification (Arm ARM DDI 0487 C4.1 "A64 instruction set encoding";
//! branch, exception-generating and system instruction classes).

use super::{ArchVersion, DecodeConfig, InstrInfo, InstrSubtype, InstrType, Isa};

#[inline]
fn sext(v: u32, shl: u32, shr: u32) -> u64 {
    (((v << shl) as i32) >> shr) as i64 as u64
}

/// FEAT_CMPBR compare-and-branch: CB<cc> (register / immediate), CBB<cc>, CBH<cc>.
#[inline]
pub(super) fn is_cmp_br(inst: u32) -> bool {
    let op = inst & 0xFF00_0000;
    let desc = inst & 0x0000_C000;
    (op == 0x7400_0000 && desc != 0x4000)
        || (op == 0xF400_0000 && desc == 0)
        || ((op == 0xF500_0000 || op == 0x7500_0000) && desc & 0x4000 == 0)
}

/// Indirect branch: returns (subtype, is_link) if `inst` is one.
#[inline]
fn indirect(inst: u32, arch: ArchVersion) -> Option<(InstrSubtype, bool)> {
    let link = || {
        if inst & 0x0020_0000 != 0 { (InstrSubtype::BrLink, true) } else { (InstrSubtype::None, false) }
    };
    if inst & 0xFFDF_FC1F == 0xD61F_0000 {
        return Some(link()); // BR, BLR
    }
    if inst & 0xFFFF_FC1F == 0xD65F_0000 {
        return Some((InstrSubtype::V8Ret, false)); // RET
    }
    if inst == 0xD69F_03E0 {
        return Some((InstrSubtype::V8Eret, false)); // ERET
    }
    if arch >= ArchVersion::V8r3 {
        if inst & 0xFFDF_F800 == 0xD71F_0800 || inst & 0xFFDF_F81F == 0xD61F_081F {
            return Some(link()); // BRAA/BRAB/BLRAA/BLRAB, BRAAZ/BRABZ/BLRAAZ/BLRABZ
        }
        if inst & 0xFFFF_FBFF == 0xD69F_0BFF {
            return Some((InstrSubtype::V8Eret, false)); // ERETAA, ERETAB
        }
        if inst & 0xFFFF_FBFF == 0xD65F_0BFF {
            return Some((InstrSubtype::V8Ret, false)); // RETAA, RETAB
        }
        if inst & 0xFFC0_001F == 0x5500_001F {
            return Some((InstrSubtype::V8Ret, false)); // RETA<k>SPPC <label> (FEAT_PAuth_LR)
        }
        if inst & 0xFFFF_FBE0 == 0xD65F_0BE0 && inst & 0x1F != 0x1F {
            return Some((InstrSubtype::V8Ret, false)); // RETA<k>SPPC <Xm>
        }
        if inst == 0xD6FF_03E0 || inst == 0xD6FF_07E0 {
            return Some((InstrSubtype::V8Eret, false)); // TEXIT (FEAT_TME) acts as ERET
        }
    }
    None
}

/// Classifies one A64 instruction at `addr`.
#[inline]
pub fn decode_a64(addr: u64, inst: u32, cfg: &DecodeConfig) -> InstrInfo {
    let mut info = InstrInfo { size: 4, next_isa: Isa::A64, ..InstrInfo::default() };
    // Fast path: most instructions are in none of the branch/system classes.
    // Branches, exception and system instructions have op0 (bits 28:26) == 0b101.
    // FEAT_CMPBR (0x74/0x75/0xF4/0xF5) and RETA*SPPC label (0x55) also have op0 = 0b101.
    if (inst >> 26) & 0x7 != 0b101 {
        return info;
    }
    if let Some((sub, link)) = indirect(inst, cfg.arch) {
        info.ty = InstrType::BrIndirect;
        info.subtype = sub;
        info.is_link = link;
    } else if inst & 0x7C00_0000 == 0x3400_0000 {
        // CBZ/CBNZ, TBZ/TBNZ
        info.ty = InstrType::Br;
        info.is_cond = true;
        info.branch_addr = if inst & 0x7E00_0000 == 0x3400_0000 {
            addr.wrapping_add(sext(inst & 0x00FF_FFE0, 8, 11))
        } else {
            addr.wrapping_add(sext(inst & 0x0007_FFE0, 13, 16))
        };
    } else if inst & 0xFF00_0000 == 0x5400_0000 {
        // B.cond, BC.cond
        info.ty = InstrType::Br;
        info.is_cond = true;
        info.branch_addr = addr.wrapping_add(sext(inst & 0x00FF_FFE0, 8, 11));
    } else if inst & 0x7C00_0000 == 0x1400_0000 {
        // B, BL
        info.ty = InstrType::Br;
        if inst & 0x8000_0000 != 0 {
            info.is_link = true;
            info.subtype = InstrSubtype::BrLink;
        }
        info.branch_addr = addr.wrapping_add(sext(inst & 0x03FF_FFFF, 6, 4));
    } else if is_cmp_br(inst) {
        info.ty = InstrType::Br;
        info.branch_addr = addr.wrapping_add(sext(inst & 0x0000_3FE0, 18, 21));
    } else if inst & 0xFFFF_F09F == 0xD503_309F {
        match inst & 0x60 {
            0x40 => info.ty = InstrType::Isb,
            0x00 | 0x20 if cfg.dsb_dmb_waypoints => info.ty = InstrType::DsbDmb,
            _ => {}
        }
    } else if cfg.wfi_wfe_branch
        && (inst & 0xFFFF_FFDF == 0xD503_205F || (cfg.arch >= ArchVersion::Aa64 && inst & 0xFFFF_FFC0 == 0xD503_1000))
    {
        info.ty = InstrType::WfiWfe;
    } else if cfg.arch >= ArchVersion::Aa64 && inst & 0xFFFF_FFE0 == 0xD523_3060 {
        info.ty = InstrType::Tstart;
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(inst: u32) -> InstrInfo {
        decode_a64(0x1000, inst, &DecodeConfig { arch: ArchVersion::Aa64, wfi_wfe_branch: true, dsb_dmb_waypoints: false })
    }

    /// Direct branch targets are PC-relative with the right immediate widths and signs.
    #[test]
    fn direct_targets() {
        // b #-4 (0x17ffffff), bl #+8 (0x94000002)
        assert_eq!(d(0x17FF_FFFF).branch_addr, 0xFFC);
        let bl = d(0x9400_0002);
        assert_eq!((bl.ty, bl.subtype, bl.branch_addr), (InstrType::Br, InstrSubtype::BrLink, 0x1008));
        // b.ne #+0x10 (0x54000081), cbz x0,#-8 (0xb4ffffc0), tbz w0,#0,#+0x20 (0x36000100)
        assert_eq!(d(0x5400_0081).branch_addr, 0x1010);
        assert!(d(0x5400_0081).is_cond);
        assert_eq!(d(0xB4FF_FFC0).branch_addr, 0xFF8);
        assert_eq!(d(0x3600_0100).branch_addr, 0x1020);
    }

    /// Indirect branches carry the RET/ERET/link sub-types, including pointer-auth forms.
    #[test]
    fn indirect_subtypes() {
        assert_eq!(d(0xD65F_03C0).subtype, InstrSubtype::V8Ret); // ret
        assert_eq!(d(0xD63F_0020).subtype, InstrSubtype::BrLink); // blr x1
        assert_eq!(d(0xD61F_0020).ty, InstrType::BrIndirect); // br x1
        assert_eq!(d(0xD69F_03E0).subtype, InstrSubtype::V8Eret); // eret
        assert_eq!(d(0xD65F_0BFF).subtype, InstrSubtype::V8Ret); // retaa
        assert_eq!(d(0xD73F_0820).subtype, InstrSubtype::BrLink); // blraa x1, x0
        assert_eq!(d(0xD503_3FDF).ty, InstrType::Isb); // isb
        assert_eq!(d(0xD503_207F).ty, InstrType::WfiWfe); // wfi
        assert_eq!(d(0xD503_3F9F).ty, InstrType::Other); // dsb sy
        assert_eq!(d(0x9100_0400).ty, InstrType::Other); // add x0,x0,#1
        assert_eq!(d(0xD400_0001).ty, InstrType::Other); // svc #0 is not a waypoint
    }

    /// Pointer-auth branches are not recognised on Armv8.0 cores, as in OpenCSD.
    #[test]
    fn pauth_gated_by_arch() {
        let cfg = DecodeConfig { arch: ArchVersion::V8, ..DecodeConfig::default() };
        assert_eq!(decode_a64(0, 0xD65F_0BFF, &cfg).ty, InstrType::Other);
    }

    /// FEAT_CMPBR compare-and-branch uses a 9-bit scaled offset.
    #[test]
    fn cmpbr_target() {
        // cbgt x0, x1, #-4 : 0xF4 01 3F E0 -> imm9 = 0x1ff (-1) -> -4
        let i = d(0xF401_3FE0);
        assert_eq!((i.ty, i.branch_addr), (InstrType::Br, 0xFFC));
    }
}
