//! Walking the program image from the current address to the next waypoint
//! (OpenCSD `traceInstrToWP`; IHI 0064 section 6.2.4 "Waypoints": between two P0 elements the
//! PE executes sequentially up to and including the next waypoint instruction).
//!
//! A64 walks read code through [`MemoryAccess::slice_at`] when available (no lookup per
//! instruction) and are memoised per block in a [`BlockCache`].

use crate::cache::{Block, BlockCache};
use crate::image::{MemSpace, MemoryAccess};
use crate::insn::{DecodeConfig, InstrInfo, InstrType, Isa, ItState, decode, decode_a64};

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

/// Optional OpenCSD decoder checks on instruction walks (all off by default, which is
/// OpenCSD's default behaviour).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Maximum instructions in one walked range; a walk reaching `range_limit + 1`
    /// instructions is an error (`OPENCSD_INSTR_RANGE_LIMIT`, OpenCSD
    /// `OCSD_ERR_I_RANGE_LIMIT_OVERRUN`). 0: no limit.
    pub range_limit: u32,
    /// An A64 opcode whose top 16 bits are zero is an error (`-aa64_opcode_chk`,
    /// `OPENCSD_ERR_ON_AA64_BAD_OPCODE`, OpenCSD `OCSD_ERR_INVALID_OPCODE`).
    pub aa64_opcode_chk: bool,
}

impl DecodeOptions {
    /// Walk cap: `range_limit + 1` with a limit, else [`MAX_WALK`].
    #[inline]
    fn cap(&self) -> u32 {
        if self.range_limit != 0 { self.range_limit.saturating_add(1).min(MAX_WALK) } else { MAX_WALK }
    }

    /// Outcome of a walk that reached its cap without a waypoint.
    #[inline]
    fn capped(&self, num: u32) -> WpRes {
        if self.range_limit != 0 && num > self.range_limit { WpRes::RangeLimit } else { WpRes::NotFound }
    }

    /// Outcome of a walk that found its waypoint after `num` instructions.
    #[inline]
    fn found(&self, num: u32) -> WpRes {
        if self.range_limit != 0 && num > self.range_limit { WpRes::RangeLimit } else { WpRes::Found }
    }

    /// Whether `op` (A64) is rejected by the opcode check.
    #[inline]
    fn bad_a64(&self, op: u32) -> bool {
        self.aa64_opcode_chk && op & 0xFFFF_0000 == 0
    }
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
    /// More than [`DecodeOptions::range_limit`] instructions (an error).
    RangeLimit,
    /// An invalid A64 opcode at `WalkState::addr` with [`DecodeOptions::aa64_opcode_chk`]
    /// (an error; the instruction is not consumed).
    BadOpcode,
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
pub fn read_opcode<M: MemoryAccess + ?Sized>(mem: &M, addr: u64, space: MemSpace, ctx: Option<u32>) -> (usize, u32) {
    let mut b = [0u8; 4];
    let n = mem.read_ctx(addr, space, ctx, &mut b);
    (n, u32::from_le_bytes(b))
}

/// Classifies the instruction at `st.addr` (handling a 16-bit T32 instruction at the very end
/// of a region); returns false if the code is not accessible.
#[inline]
pub fn step<M: MemoryAccess + ?Sized>(
    st: &mut WalkState,
    mem: &M,
    space: MemSpace,
    ctx: Option<u32>,
    cfg: &DecodeConfig,
) -> bool {
    let (n, op) = read_opcode(mem, st.addr, space, ctx);
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
/// address equals `target`. `cache` (A64 waypoint walks only) memoises blocks under `tag`
/// (only blocks that passed the `opts` checks are stored, so the cache must be cleared when
/// `opts` change).
#[allow(clippy::too_many_arguments)]
pub fn walk<M: MemoryAccess + ?Sized>(
    st: &mut WalkState,
    mem: &M,
    space: MemSpace,
    ctx: Option<u32>,
    cfg: &DecodeConfig,
    opts: &DecodeOptions,
    target: Option<u64>,
    cache: Option<(&BlockCache, u64)>,
) -> (RawRange, WpRes) {
    let start = st.addr;
    let mut num = 0u32;
    if target.is_none() && st.isa == Isa::A64 {
        if let Some((c, tag)) = cache
            && let Some(b) = c.get(start, tag)
        {
            let (end, num, last) = (b.end, b.num_instr, b.last);
            st.addr = end;
            st.last = last;
            return (RawRange { start, end, num }, WpRes::Found);
        }
        let res = walk_a64(st, mem, space, ctx, cfg, opts, &mut num);
        if res == WpRes::Found
            && let Some((c, tag)) = cache
        {
            c.put(start, tag, Block { end: st.addr, num_instr: num, last: st.last });
        }
        return (RawRange { start, end: st.addr, num }, res);
    }
    let cap = opts.cap();
    loop {
        if opts.aa64_opcode_chk && st.isa == Isa::A64 {
            let (n, op) = read_opcode(mem, st.addr, space, ctx);
            if n == 4 && opts.bad_a64(op) {
                return (RawRange { start, end: st.addr, num }, WpRes::BadOpcode);
            }
        }
        if !step(st, mem, space, ctx, cfg) {
            return (RawRange { start, end: st.addr, num }, WpRes::Nacc);
        }
        num += 1;
        let found = match target {
            Some(t) => st.addr == t,
            None => st.last.ty != InstrType::Other,
        };
        if found {
            return (RawRange { start, end: st.addr, num }, opts.found(num));
        }
        if num >= cap {
            return (RawRange { start, end: st.addr, num }, opts.capped(num));
        }
    }
}

#[inline]
fn walk_a64<M: MemoryAccess + ?Sized>(
    st: &mut WalkState,
    mem: &M,
    space: MemSpace,
    ctx: Option<u32>,
    cfg: &DecodeConfig,
    opts: &DecodeOptions,
    num: &mut u32,
) -> WpRes {
    let cap = opts.cap();
    loop {
        match mem.slice_at_ctx(st.addr, space, ctx) {
            Some(s) if s.len() >= 4 => {
                let mut info = st.last;
                for w in s.chunks_exact(4) {
                    let op = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                    if opts.bad_a64(op) {
                        st.last = info;
                        return WpRes::BadOpcode;
                    }
                    info = decode_a64(st.addr, op, cfg);
                    st.addr = st.addr.wrapping_add(4);
                    *num += 1;
                    if info.ty != InstrType::Other {
                        st.last = info;
                        return opts.found(*num);
                    }
                    if *num >= cap {
                        st.last = info;
                        return opts.capped(*num);
                    }
                }
                // fell off the end of this region: continue in the next one (if any)
                st.last = info;
            }
            Some(_) => return WpRes::Nacc,
            None => {
                if opts.aa64_opcode_chk {
                    let (n, op) = read_opcode(mem, st.addr, space, ctx);
                    if n == 4 && opts.bad_a64(op) {
                        return WpRes::BadOpcode;
                    }
                }
                if !step(st, mem, space, ctx, cfg) {
                    return WpRes::Nacc;
                }
                *num += 1;
                if st.last.ty != InstrType::Other {
                    return opts.found(*num);
                }
                if *num >= cap {
                    return opts.capped(*num);
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
        let c = BlockCache::new(4);
        let (r, res) = walk(&mut st, &m, MemSpace::EL1N, None, &cfg, &DecodeOptions::default(), None, Some((&c, 0)));
        assert_eq!((r.start, r.end, r.num, res), (0x1000, 0x100C, 3, WpRes::Found));
        assert_eq!(st.last.branch_addr, 0x1010);
        // second walk is served by the cache with the same result
        let mut st2 = WalkState { addr: 0x1000, isa: Isa::A64, ..Default::default() };
        let (r2, _) = walk(&mut st2, &m, MemSpace::EL1N, None, &cfg, &DecodeOptions::default(), None, Some((&c, 0)));
        assert_eq!((r2, st2.last.branch_addr, c.hits()), (r, 0x1010, 1));
    }

    /// With a range limit, a walk of exactly `limit` instructions is fine and one more
    /// instruction (waypoint or not) is a `RangeLimit` error; no limit keeps the full walk.
    #[test]
    fn walk_range_limit() {
        let m = image(&[0xD503201F, 0xD503201F, 0x14000002, 0xD503201F]); // nop; nop; b +8; nop
        let run = |limit| {
            let mut st = WalkState { addr: 0x1000, isa: Isa::A64, ..Default::default() };
            let opts = DecodeOptions { range_limit: limit, aa64_opcode_chk: false };
            walk(&mut st, &m, MemSpace::ANY, None, &DecodeConfig::default(), &opts, None, None)
        };
        assert_eq!(run(3).1, WpRes::Found);
        assert_eq!(run(0).1, WpRes::Found);
        assert_eq!((run(2).0.num, run(2).1), (3, WpRes::RangeLimit));
        assert_eq!((run(1).0.num, run(1).1), (2, WpRes::RangeLimit));
    }

    /// The A64 opcode check rejects a word with zero top half before consuming it, and only
    /// when enabled.
    #[test]
    fn walk_bad_opcode() {
        let m = image(&[0xD503201F, 0x0000_1234, 0x14000002]); // nop; udf-space; b +8
        let run = |chk| {
            let mut st = WalkState { addr: 0x1000, isa: Isa::A64, ..Default::default() };
            let opts = DecodeOptions { range_limit: 0, aa64_opcode_chk: chk };
            let (r, res) = walk(&mut st, &m, MemSpace::ANY, None, &DecodeConfig::default(), &opts, None, None);
            (r.num, res, st.addr)
        };
        assert_eq!(run(true), (1, WpRes::BadOpcode, 0x1004));
        assert_eq!(run(false), (3, WpRes::Found, 0x100C));
    }

    /// Walking off the image gives NACC at the first missing address.
    #[test]
    fn walk_off_image() {
        let m = image(&[0xD503201F]);
        let mut st = WalkState { addr: 0x1000, isa: Isa::A64, ..Default::default() };
        let (r, res) = walk(&mut st, &m, MemSpace::ANY, None, &DecodeConfig::default(), &DecodeOptions::default(), None, None);
        assert_eq!((r.num, res, st.addr), (1, WpRes::Nacc, 0x1004));
    }

    /// A target walk stops when the next address reaches the target.
    #[test]
    fn walk_to_target() {
        let m = image(&[0xD503201F, 0x14000000, 0xD503201F]);
        let mut st = WalkState { addr: 0x1000, isa: Isa::A64, ..Default::default() };
        let (r, res) =
            walk(&mut st, &m, MemSpace::ANY, None, &DecodeConfig::default(), &DecodeOptions::default(), Some(0x100C), None);
        assert_eq!((r.num, res), (3, WpRes::Found));
    }
}
