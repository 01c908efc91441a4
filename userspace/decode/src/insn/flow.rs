//! What an A64 instruction does to the control flow, for the code facts outside the trace
//! decoder: the join's validation (`etm-session`) and the PGO writers' code facts
//! (`etm-write`, what llvm-profgen's disassembler reports as calls, returns and direct jumps).
//! One classification: built on [`decode_a64`] (the decoder's waypoints, PAuth and FEAT_CMPBR
//! forms included), with the exception-generating class the decoder has no use for (Arm ARM
//! DDI 0487, C4.1.3 "Branches, Exception Generating and System instructions").

use super::a64::is_cmp_br;
use super::{ArchVersion, DecodeConfig, InstrSubtype, InstrType, decode_a64};

/// Control-flow class of an A64 instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flow {
    /// Not a branch (ISB, WFI/WFE and TSTART included: they fall through).
    Other,
    /// BL.
    Call,
    /// BLR, BLRAA/BLRAAZ/BLRAB/BLRABZ.
    IndirectCall,
    /// B.
    Jump,
    /// BR, BRAA/BRAAZ/BRAB/BRABZ.
    IndirectJump,
    /// B.cond, BC.cond, CBZ/CBNZ, TBZ/TBNZ, CB<cc>/CBB<cc>/CBH<cc> (may be not taken).
    CondBranch,
    /// RET, RETAA/RETAB, RETA<k>SPPC.
    Return,
    /// ERET, ERETAA/ERETAB, DRPS, TEXIT.
    ExceptionReturn,
    /// SVC, HVC, SMC: execution resumes after the instruction.
    Exception,
    /// BRK, HLT, DCPS<n>: execution does not go on in this code.
    Halt,
}

impl Flow {
    /// A call, direct or indirect.
    pub fn is_call(self) -> bool {
        matches!(self, Flow::Call | Flow::IndirectCall)
    }
}

/// Every A64 form enabled (the latest architecture).
const ALL: DecodeConfig = DecodeConfig { arch: ArchVersion::Aa64, wfi_wfe_branch: false, dsb_dmb_waypoints: false };

/// DRPS (debug state only): an exception return the decoder's waypoints leave out.
const DRPS: u32 = 0xD6BF_03E0;

/// The control-flow class of one A64 instruction word.
#[inline]
pub fn a64_flow(inst: u32) -> Flow {
    let info = decode_a64(0, inst, &ALL);
    match info.ty {
        InstrType::Br if info.is_link => Flow::Call,
        InstrType::Br if info.is_cond || is_cmp_br(inst) => Flow::CondBranch,
        InstrType::Br => Flow::Jump,
        InstrType::BrIndirect => match info.subtype {
            InstrSubtype::V8Ret => Flow::Return,
            InstrSubtype::V8Eret => Flow::ExceptionReturn,
            _ if info.is_link => Flow::IndirectCall,
            _ => Flow::IndirectJump,
        },
        _ if inst == DRPS => Flow::ExceptionReturn,
        // Exception generation: opc (bits 23:21) 000 is SVC/HVC/SMC, the rest BRK/HLT/DCPS.
        _ if inst & 0xFF00_0000 == 0xD400_0000 => {
            if (inst >> 21) & 7 == 0 {
                Flow::Exception
            } else {
                Flow::Halt
            }
        }
        _ => Flow::Other,
    }
}
