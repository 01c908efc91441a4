//! T32 waypoint classification (Arm ARM DDI 0487 F3 "T32 instruction set encoding";
//! Armv8.1-M low-overhead loops from DDI 0553), following OpenCSD's `inst_Thumb_*` rules,
//! including IT-block tracking for the conditional flag.

use super::{DecodeConfig, InstrInfo, InstrSubtype, InstrType, Isa, ItState, is_wide_thumb};

/// Direct branch: (is_link, is_cond).
fn direct(inst: u32) -> Option<(bool, bool)> {
    if inst & 0xF000_0000 == 0xD000_0000 && inst & 0x0E00_0000 != 0x0E00_0000 {
        Some((false, true)) // B<c> T1
    } else if inst & 0xF800_0000 == 0xE000_0000 {
        Some((false, false)) // B T2
    } else if inst & 0xF800_D000 == 0xF000_8000 && inst & 0x0380_0000 != 0x0380_0000 {
        Some((false, true)) // B<c> T3
    } else if inst & 0xF800_9000 == 0xF000_9000 {
        Some((inst & 0x0000_4000 != 0, false)) // B T4, BL T1
    } else if inst & 0xF800_D001 == 0xF000_C000 {
        Some((true, false)) // BLX (imm) T2
    } else if inst & 0xF500_0000 == 0xB100_0000 {
        Some((false, true)) // CBZ/CBNZ
    } else if inst & 0xFFFF_F001 == 0xF00F_C001
        || inst & 0xFFFF_F001 == 0xF02F_C001
        || inst & 0xFFFF_F001 == 0xF01F_C001
        || inst & 0xFFF0_F001 == 0xF040_C001
        || inst & 0xFFC0_F001 == 0xF000_C001
    {
        Some((false, false)) // LE, LE (T2), LETP, WLS, WLSTP
    } else {
        None
    }
}

fn target(addr: u32, inst: u32) -> u32 {
    if inst & 0xF000_0000 == 0xD000_0000 && inst & 0x0E00_0000 != 0x0E00_0000 {
        addr.wrapping_add(4).wrapping_add((((inst & 0x00FF_0000) << 8) as i32 >> 23) as u32) | 1
    } else if inst & 0xF800_0000 == 0xE000_0000 {
        addr.wrapping_add(4).wrapping_add((((inst & 0x07FF_0000) << 5) as i32 >> 20) as u32) | 1
    } else if inst & 0xF800_D000 == 0xF000_8000 && inst & 0x0380_0000 != 0x0380_0000 {
        let off = ((inst & 0x0400_0000) << 5)
            | ((inst & 0x0800) << 19)
            | ((inst & 0x2000) << 16)
            | ((inst & 0x003F_0000) << 7)
            | ((inst & 0x0000_07FF) << 12);
        addr.wrapping_add(4).wrapping_add((off as i32 >> 11) as u32) | 1
    } else if inst & 0xF800_9000 == 0xF000_9000 {
        let s = ((inst & 0x0400_0000) >> 26).wrapping_sub(1);
        let off = ((inst & 0x0400_0000) << 5)
            | (((inst ^ s) & 0x2000) << 17)
            | (((inst ^ s) & 0x0800) << 18)
            | ((inst & 0x03FF_0000) << 3)
            | ((inst & 0x0000_07FF) << 8);
        addr.wrapping_add(4).wrapping_add((off as i32 >> 7) as u32) | 1
    } else if inst & 0xF800_D001 == 0xF000_C000 {
        let s = ((inst & 0x0400_0000) >> 26).wrapping_sub(1);
        let off = ((inst & 0x0400_0000) << 5)
            | (((inst ^ s) & 0x2000) << 17)
            | (((inst ^ s) & 0x0800) << 18)
            | ((inst & 0x03FF_0000) << 3)
            | ((inst & 0x0000_07FE) << 8);
        (addr & 0xFFFF_FFFC).wrapping_add(4).wrapping_add((off as i32 >> 7) as u32)
    } else if inst & 0xF500_0000 == 0xB100_0000 {
        addr.wrapping_add(4).wrapping_add((((inst & 0x0200_0000) << 6) | ((inst & 0x00F8_0000) << 7)) >> 25) | 1
    } else if inst & 0xFFFF_F001 == 0xF00F_C001 || inst & 0xFFFF_F001 == 0xF02F_C001 || inst & 0xFFFF_F001 == 0xF01F_C001 {
        addr.wrapping_add(4).wrapping_sub(((inst & 0x07FE) << 1) | ((inst & 0x0800) >> 10)) | 1
    } else {
        // WLS / WLSTP
        addr.wrapping_add(4).wrapping_add(((inst & 0x07FE) << 1) | ((inst & 0x0800) >> 10)) | 1
    }
}

/// Indirect branch: (is_link, subtype).
fn indirect(inst: u32) -> Option<(bool, InstrSubtype)> {
    use InstrSubtype::*;
    if inst & 0xFF00_0000 == 0x4700_0000 {
        if inst & 0x0080_0000 != 0 {
            Some((true, BrLink))
        } else if inst & 0x0078_0000 == 0x0070_0000 {
            Some((false, V7ImpliedRet)) // BX LR
        } else {
            Some((false, None))
        }
    } else if inst & 0xFFF0_D000 == 0xF3C0_8000 {
        Some((false, None)) // BXJ
    } else if inst & 0xFF00_0000 == 0xBD00_0000 {
        Some((false, V7ImpliedRet)) // POP {pc}
    } else if inst & 0xFD87_0000 == 0x4487_0000 {
        Some((false, if inst & 0xFFFF_0000 == 0x46F7_0000 { V7ImpliedRet } else { None }))
    } else if inst & 0xFFF0_FFE0 == 0xE8D0_F000
        || inst & 0xFFD0_0000 == 0xE810_0000
        || inst & 0xFFD0_0000 == 0xE990_0000
        || inst & 0xFFF0_D000 == 0xF3D0_8000
        || inst & 0xFFF0_F000 == 0xF8D0_F000
        || inst & 0xFF7F_F000 == 0xF85F_F000
    {
        Some((false, None)) // TBB/TBH, RFE, SUBS pc,lr / ERET, LDR pc imm/literal
    } else if inst & 0xFFF0_F800 == 0xF850_F800 {
        Some((false, if inst & 0x000F_0F00 == 0x000D_0B00 { V7ImpliedRet } else { None }))
    } else if inst & 0xFFF0_FFC0 == 0xF850_F000 {
        Some((false, None)) // LDR pc, reg
    } else if inst & 0xFE50_8000 == 0xE810_8000 {
        Some((false, if inst & 0x0FFF_0000 == 0x08BD_0000 { V7ImpliedRet } else { None }))
    } else {
        Option::None
    }
}

fn it_count(inst: u32) -> u8 {
    if inst & 0xFF00_0000 != 0xBF00_0000 || inst & 0x000F_0000 == 0 {
        0
    } else if inst & 0x0001_0000 != 0 {
        4
    } else if inst & 0x0002_0000 != 0 {
        3
    } else if inst & 0x0004_0000 != 0 {
        2
    } else {
        1
    }
}

/// Classifies one T32 instruction; `raw` is the 4 bytes at `addr` read little-endian.
pub fn decode_t32(addr: u64, raw: u32, cfg: &DecodeConfig, it: &mut ItState) -> InstrInfo {
    let inst = raw.rotate_left(16); // first halfword in the top 16 bits
    let mut info =
        InstrInfo { size: if is_wide_thumb((inst >> 16) as u16) { 4 } else { 2 }, next_isa: Isa::Thumb2, ..InstrInfo::default() };
    if let Some((link, cond)) = direct(inst) {
        info.ty = InstrType::Br;
        info.is_link = link;
        info.is_cond = cond;
        if link {
            info.subtype = InstrSubtype::BrLink;
        }
        let t = target(addr as u32, inst);
        info.branch_addr = (t & !1) as u64;
        if t & 1 == 0 {
            info.next_isa = Isa::Arm;
        }
    } else if let Some((link, sub)) = indirect(inst) {
        info.ty = InstrType::BrIndirect;
        info.is_link = link;
        info.subtype = sub;
    } else if inst & 0xFFFF_FF00 == 0xF3BF_8F00 {
        match inst & 0xF0 {
            0x60 => info.ty = InstrType::Isb,
            0x40 | 0x50 if cfg.dsb_dmb_waypoints => info.ty = InstrType::DsbDmb,
            _ => {}
        }
    } else if inst & 0xFFFF_0F00 == 0xEE07_0F00 {
        match inst & 0xFF {
            0x95 => info.ty = InstrType::Isb,
            0x9A | 0xBA if cfg.dsb_dmb_waypoints => info.ty = InstrType::DsbDmb,
            _ => {}
        }
    } else if cfg.wfi_wfe_branch && (inst & 0xFFFF_FFFE == 0xF3AF_8002 || inst & 0xFFEF_0000 == 0xBF20_0000) {
        info.ty = InstrType::WfiWfe;
    }
    // Conditional branches (B<c> T1/T3, CBZ) are already flagged by `direct`.
    if it.remaining == 0 {
        if info.ty == InstrType::Other {
            it.remaining = it_count(inst);
        }
    } else {
        info.is_cond = true;
        it.remaining -= 1;
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 16-bit vs 32-bit T32 sizes and a BL target.
    #[test]
    fn t32_sizes_and_bl() {
        let cfg = DecodeConfig::default();
        let mut it = ItState::default();
        // bx lr = 0x4770 (16-bit), followed by junk
        let bx = decode_t32(0x100, 0x0000_4770, &cfg, &mut it);
        assert_eq!((bx.size, bx.subtype), (2, InstrSubtype::V7ImpliedRet));
        // bl #0 : f000 f800 -> target = addr + 4
        let bl = decode_t32(0x100, 0xF800_F000, &cfg, &mut it);
        assert_eq!((bl.size, bl.is_link, bl.branch_addr), (4, true, 0x104));
    }

    /// An IT instruction makes the following instructions conditional.
    #[test]
    fn it_block() {
        let cfg = DecodeConfig::default();
        let mut it = ItState::default();
        // ite eq = 0xbf0c (2 conditional instructions)
        decode_t32(0, 0x0000_BF0C, &cfg, &mut it);
        assert_eq!(it.remaining, 2);
        assert!(decode_t32(2, 0x0000_4770, &cfg, &mut it).is_cond);
        assert!(decode_t32(4, 0x0000_bf00, &cfg, &mut it).is_cond);
        assert!(!decode_t32(6, 0x0000_bf00, &cfg, &mut it).is_cond);
    }
}
