//! Walking the program image from the current address to the next waypoint
//! (OpenCSD `traceInstrToWP`; IHI 0064 section 6.2.4 "Waypoints": between two P0 elements the
//! PE executes sequentially up to and including the next waypoint instruction).
//!
//! A64 walks read code through [`MemoryAccess::slice_at`] when available (no lookup per
//! instruction) and are memoised per block in a [`BlockCache`].

use crate::cache::{Block, BlockCache};
use crate::image::{MemSpace, MemoryAccess};
use crate::insn::{decode, decode_a64, DecodeConfig, InstrInfo, InstrType, Isa, ItState};

/// Upper bound on instructions walked for one range: a safety net against runaway walks
/// over huge images (OpenCSD has no limit by default; real ranges are far shorter).
pub const MAX_WALK: u32 = 1 << 24;

/// Instruction-follower state (OpenCSD `ocsd_instr_info`): the next address to execute,
/// its ISA, the last instruction classified and the T32 IT-block state.
#[derive(Debug, Clone, Copy, Default)]
pub struct WalkState {
    /// Next instruction address.
    pub addr: u64,
    /// ISA at `addr`.
    pub isa: Isa,
    /// Last instruction classified.
    pub last: InstrInfo,
    /// T32 IT-block state.
    pub it: ItState,
}

/// Outcome of a walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WpRes {
    /// Stopped without a waypoint (only with the safety limit).
    NotFound,
    /// Found the waypoint (or the target address).
    Found,
    /// Code not accessible at `WalkState::addr`.
    Nacc,
}

/// Addresses and count of a walked range.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawRange {
    /// First instruction.
    pub start: u64,
    /// Exclusive end.
    pub end: u64,
    /// Instructions.
    pub num: u32,
}

/// Reads up to 4 opcode bytes: (bytes available, little-endian value).
#[inline]
pub fn read_opcode<M: MemoryAccess + ?Sized>(mem: &M, addr: u64, space: MemSpace) -> (usize, u32) {
    let mut b = [0u8; 4];
    let n = mem.read(addr, space, &mut b);
    (n, u32::from_le_bytes(b))
}

/// Classifies the instruction at `st.addr` (handling a 16-bit T32 instruction at the very end
/// of a region); returns false if the code is not accessible.
#[inline]
pub fn step<M: MemoryAccess + ?Sized>(st: &mut WalkState, mem: &M, space: MemSpace, cfg: &DecodeConfig) -> bool {
    let (n, op) = read_opcode(mem, st.addr, space);
    let op = if n == 4 {
        op
    } else if n >= 2 && st.isa == Isa::Thumb2 && !crate::insn::is_wide_thumb(op as u16) {
        op & 0xFFFF
    } else {
        return false;
    };
    st.last = decode(st.isa, st.addr, op, cfg, &mut st.it);
    st.addr = st.addr.wrapping_add(st.last.size as u64);
    true
}

/// Walks from `st.addr` to the next waypoint, or (with `target`) until the next instruction
/// address equals `target`. `cache` (A64 waypoint walks only) memoises blocks under `tag`.
pub fn walk<M: MemoryAccess + ?Sized>(
    st: &mut WalkState,
    mem: &M,
    space: MemSpace,
    cfg: &DecodeConfig,
    target: Option<u64>,
    cache: Option<(&mut BlockCache, u64)>,
) -> (RawRange, WpRes) {
    let start = st.addr;
    let mut num = 0u32;
    if target.is_none() && st.isa == Isa::A64 {
        let mut cache = cache;
        if let Some((c, tag)) = cache.as_mut() {
            if let Some(b) = c.get(start, *tag) {
                let (end, num, last) = (b.end, b.num_instr, b.last);
                st.addr = end;
                st.last = last;
                return (RawRange { start, end, num }, WpRes::Found);
            }
        }
        let res = walk_a64(st, mem, space, cfg, &mut num);
        if res == WpRes::Found {
            if let Some((c, tag)) = cache {
                c.put(start, tag, Block { end: st.addr, num_instr: num, last: st.last });
            }
        }
        return (RawRange { start, end: st.addr, num }, res);
    }
    loop {
        if !step(st, mem, space, cfg) {
            return (RawRange { start, end: st.addr, num }, WpRes::Nacc);
        }
        num += 1;
        let found = match target {
            Some(t) => st.addr == t,
            None => st.last.ty != InstrType::Other,
        };
        if found {
            return (RawRange { start, end: st.addr, num }, WpRes::Found);
        }
        if num >= MAX_WALK {
            return (RawRange { start, end: st.addr, num }, WpRes::NotFound);
        }
    }
}

#[inline]
fn walk_a64<M: MemoryAccess + ?Sized>(
    st: &mut WalkState,
    mem: &M,
    space: MemSpace,
    cfg: &DecodeConfig,
    num: &mut u32,
) -> WpRes {
    loop {
        match mem.slice_at(st.addr, space) {
            Some(s) if s.len() >= 4 => {
                let mut info = st.last;
                for w in s.chunks_exact(4) {
                    let op = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                    info = decode_a64(st.addr, op, cfg);
                    st.addr = st.addr.wrapping_add(4);
                    *num += 1;
                    if info.ty != InstrType::Other {
                        st.last = info;
                        return WpRes::Found;
                    }
                    if *num >= MAX_WALK {
                        st.last = info;
                        return WpRes::NotFound;
                    }
                }
                // fell off the end of this region: continue in the next one (if any)
                st.last = info;
            }
            Some(_) => return WpRes::Nacc,
            None => {
                if !step(st, mem, space, cfg) {
                    return WpRes::Nacc;
                }
                *num += 1;
                if st.last.ty != InstrType::Other {
                    return WpRes::Found;
                }
                if *num >= MAX_WALK {
                    return WpRes::NotFound;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::MemoryImage;

    fn image(words: &[u32]) -> MemoryImage {
        let mut m = MemoryImage::new();
        m.add(0x1000, words.iter().flat_map(|w| w.to_le_bytes()).collect(), MemSpace::ANY);
        m
    }

    /// A walk stops after the first branch and reports the instruction count.
    #[test]
    fn walk_to_branch() {
        let m = image(&[0xD503201F, 0xD503201F, 0x14000002, 0xD503201F]); // nop; nop; b +8; nop
        let mut st = WalkState { addr: 0x1000, isa: Isa::A64, ..Default::default() };
        let cfg = DecodeConfig::default();
        let mut c = BlockCache::new(4);
        let (r, res) = walk(&mut st, &m, MemSpace::EL1N, &cfg, None, Some((&mut c, 0)));
        assert_eq!((r.start, r.end, r.num, res), (0x1000, 0x100C, 3, WpRes::Found));
        assert_eq!(st.last.branch_addr, 0x1010);
        // second walk is served by the cache with the same result
        let mut st2 = WalkState { addr: 0x1000, isa: Isa::A64, ..Default::default() };
        let (r2, _) = walk(&mut st2, &m, MemSpace::EL1N, &cfg, None, Some((&mut c, 0)));
        assert_eq!((r2, st2.last.branch_addr, c.hits), (r, 0x1010, 1));
    }

    /// Walking off the image gives NACC at the first missing address.
    #[test]
    fn walk_off_image() {
        let m = image(&[0xD503201F]);
        let mut st = WalkState { addr: 0x1000, isa: Isa::A64, ..Default::default() };
        let (r, res) = walk(&mut st, &m, MemSpace::ANY, &DecodeConfig::default(), None, None);
        assert_eq!((r.num, res, st.addr), (1, WpRes::Nacc, 0x1004));
    }

    /// A target walk stops when the next address reaches the target.
    #[test]
    fn walk_to_target() {
        let m = image(&[0xD503201F, 0x14000000, 0xD503201F]);
        let mut st = WalkState { addr: 0x1000, isa: Isa::A64, ..Default::default() };
        let (r, res) = walk(&mut st, &m, MemSpace::ANY, &DecodeConfig::default(), Some(0x100C), None);
        assert_eq!((r.num, res), (3, WpRes::Found));
    }
}
