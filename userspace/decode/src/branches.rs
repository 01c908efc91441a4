//! Last-branch records synthesised from the element stream, with perf's rules
//! (`tools/perf/util/cs-etm.c`: `cs_etm__update_last_branch_rb`, `cs_etm__exception`,
//! `cs_etm__flush`): when an instruction range follows a range whose last instruction was a
//! taken branch, record `{from: last instruction of the previous range, to: first instruction
//! of the new range}`. An exception (or exception return) marks the previous range as ending in
//! a taken branch, so the interrupted-at -> handler edge is recorded. A discontinuity
//! (`TRACE_ON`, `NO_SYNC`, `EO_TRACE`, which also covers overflow) breaks the chain and empties
//! the ring. Records are kept in a fixed-depth ring, newest first (LBR order).

use crate::elements::{Element, ElementKind, InstrRange};
use crate::insn::InstrType;

/// One taken branch: `from` is the branch instruction, `to` its target. The one branch type of
/// the crates: the pipeline's `BranchPair` and the profile's `Branch` are this type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BranchRecord {
    /// Address of the branch instruction.
    pub from: u64,
    /// Address of the first instruction executed after it.
    pub to: u64,
}

/// Fixed-depth ring of the most recent branch records.
#[derive(Debug, Clone)]
pub struct BranchRing {
    buf: Vec<BranchRecord>,
    /// index of the newest record
    pos: usize,
    len: usize,
}

impl BranchRing {
    /// A ring holding up to `depth` records (at least 1).
    pub fn new(depth: usize) -> Self {
        let depth = depth.max(1);
        BranchRing { buf: vec![BranchRecord::default(); depth], pos: 0, len: 0 }
    }

    /// Capacity.
    pub fn depth(&self) -> usize {
        self.buf.len()
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No records.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds the newest record (the oldest falls out when full).
    pub fn push(&mut self, r: BranchRecord) {
        self.pos = if self.pos == 0 { self.buf.len() - 1 } else { self.pos - 1 };
        self.buf[self.pos] = r;
        if self.len < self.buf.len() {
            self.len += 1;
        }
    }

    /// Empties the ring.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Records, newest first.
    pub fn iter(&self) -> impl Iterator<Item = &BranchRecord> + '_ {
        let n = self.buf.len();
        (0..self.len).map(move |i| &self.buf[(self.pos + i) % n])
    }

    /// Copies the records newest first into `out`; returns how many were written.
    pub fn copy_to(&self, out: &mut [BranchRecord]) -> usize {
        let mut k = 0;
        for (o, r) in out.iter_mut().zip(self.iter()) {
            *o = *r;
            k += 1;
        }
        k
    }
}

/// perf's rule, the one place for it: the branch chain of one trace source. When an
/// instruction range follows a range whose last instruction was a taken branch (or that an
/// exception followed), the record `{from: last instruction of the previous range, to: first
/// instruction of the new range}` is made; a discontinuity breaks the chain. Both the
/// element-level [`BranchBuilder`] and the live pipeline's decoder adapter
/// (`etm_session::decoder`, which takes the decoder's ranges in runs) run it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BranchRule {
    /// The last range since the last discontinuity: its last instruction's address and type.
    prev: Option<(u64, InstrType)>,
    /// That range ended in a taken branch, or an exception followed it.
    prev_taken: bool,
    /// `prev_taken` was set by an exception after the range (perf records the edge to the
    /// handler), not by the range's own branch.
    by_exception: bool,
}

impl BranchRule {
    /// The next range: the record it completes, if any (`cs_etm__update_last_branch_rb` on
    /// a range after a taken branch).
    #[inline(always)]
    pub fn range(&mut self, r: &InstrRange) -> Option<BranchRecord> {
        let rec = match self.prev {
            Some((from, _)) if self.prev_taken => Some(BranchRecord { from, to: r.start }),
            _ => None,
        };
        self.prev = Some((r.last_instr_addr(), r.last_type));
        self.prev_taken = Self::ends_taken(r);
        self.by_exception = false;
        rec
    }

    /// The range ends in a branch that was taken (the one rule of [`range`](Self::range) and
    /// [`ranges`](Self::ranges)).
    #[inline(always)]
    fn ends_taken(r: &InstrRange) -> bool {
        r.executed && matches!(r.last_type, InstrType::Br | InstrType::BrIndirect)
    }

    /// [`range`](Self::range) over a run of ranges: the records they complete, in order,
    /// written to the start of `out` (which must hold `rs.len()`: a range completes at most
    /// one); returns how many. `each(i, range)` is called for every range in the same loop.
    /// One loop with the chain in locals and a store per range, taken or not, for the
    /// decoder's runs.
    #[inline(always)]
    pub fn ranges<R: AsRef<InstrRange>>(
        &mut self,
        rs: &[R],
        out: &mut [BranchRecord],
        mut each: impl FnMut(usize, &InstrRange),
    ) -> usize {
        let Some(last) = rs.last() else { return 0 };
        let out = &mut out[..rs.len()];
        let mut from = self.prev.map_or(0, |p| p.0);
        let mut taken = self.prev.is_some() && self.prev_taken;
        let mut k = 0;
        for (i, r) in rs.iter().enumerate() {
            let r = r.as_ref();
            each(i, r);
            out[k] = BranchRecord { from, to: r.start };
            k += usize::from(taken);
            from = r.last_instr_addr();
            taken = Self::ends_taken(r);
        }
        self.prev = Some((from, last.as_ref().last_type));
        self.prev_taken = taken;
        self.by_exception = false;
        k
    }

    /// The chain a stretch of ranges is ruled from where the chain before it is not known
    /// (the decoder's branch batches, `ElementSink::branches`; the run cache's stored runs):
    /// as after a taken branch at address 0, so the stretch's first range always makes a
    /// record, whose `from` the chain it [`join`](Self::join)s fills in, or drops.
    pub const OPEN: BranchRule = BranchRule::after(RangeEnd::OPEN);

    /// A stretch of at least one range, ruled from [`OPEN`](Self::OPEN) to `end`, continues
    /// this chain: returns the `from` of the stretch's first record if this chain makes that
    /// record (the previous range ended in a taken branch or an exception followed it), `None`
    /// if it drops it; the chain is then `end`. The same records as [`range`](Self::range)
    /// over the stretch's ranges from here.
    #[inline(always)]
    pub fn join(&mut self, end: &BranchRule) -> Option<u64> {
        let from = match self.prev {
            Some((from, _)) if self.prev_taken => Some(from),
            _ => None,
        };
        *self = *end;
        from
    }

    /// A stored stretch of ranges (ruled from [`OPEN`](Self::OPEN) when it was stored, to
    /// `end`: its records after the first, `n` (at most `N`) of them at the start of
    /// `inner`) whose first range starts at `start`, after the range `chain` describes: its
    /// records written to `out` from `k` (room for `1 + N` there); returns the `k` after them,
    /// `chain` is then `end`. For the decoder's loop over the run cache, on the chain packed:
    /// no branch, a fixed-size copy.
    #[inline(always)]
    pub fn stored<const N: usize>(
        chain: &mut RangeEnd,
        start: u64,
        inner: &[BranchRecord; N],
        n: usize,
        end: RangeEnd,
        out: &mut [BranchRecord],
        k: usize,
    ) -> usize {
        debug_assert!(n <= N);
        out[k] = BranchRecord { from: chain.from, to: start };
        let k = k + usize::from(chain.taken);
        // (most runs make few: half the block, the rest when there are more)
        let h = N / 2;
        out[k..k + h].copy_from_slice(&inner[..h]);
        if n > h {
            out[k + h..k + N].copy_from_slice(&inner[h..]);
        }
        *chain = end;
        k + n
    }

    /// The chain right after a range, packed ([`RangeEnd`]); `None` before any range or
    /// with an exception since.
    #[inline]
    pub fn range_end(&self) -> Option<RangeEnd> {
        match self.prev {
            Some((from, ty)) if !self.by_exception => Some(RangeEnd { from, ty, taken: self.prev_taken }),
            _ => None,
        }
    }

    /// The chain right after the range `end` describes.
    #[inline(always)]
    pub const fn after(end: RangeEnd) -> Self {
        BranchRule { prev: Some((end.from, end.ty)), prev_taken: end.taken, by_exception: false }
    }
}

/// What [`BranchRule`] keeps of a chain right after a range (no exception since), packed for
/// the run cache and the decoder's batches: the range's last instruction's address and type,
/// and whether it was a taken branch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RangeEnd {
    /// Address of the range's last instruction.
    pub from: u64,
    /// Its type.
    pub ty: InstrType,
    /// It was a taken branch.
    pub taken: bool,
}

impl RangeEnd {
    /// [`BranchRule::OPEN`], packed.
    pub const OPEN: RangeEnd = RangeEnd { from: 0, ty: InstrType::Br, taken: true };
}

impl BranchRule {
    /// An exception (or exception return) after the last range: the next range's start is
    /// recorded as its target (`cs_etm__exception`).
    #[inline]
    pub fn exception(&mut self) {
        if self.prev.is_some() {
            if !self.prev_taken {
                self.by_exception = true;
            }
            self.prev_taken = true;
        }
    }

    /// An element other than a range: an exception or exception return marks the last range
    /// ([`exception`](Self::exception)), a discontinuity (trace on, no sync, end of trace)
    /// breaks the chain ([`break_chain`](Self::break_chain); returns true), the rest do
    /// nothing.
    #[inline]
    pub fn other_element(&mut self, kind: &ElementKind) -> bool {
        match kind {
            ElementKind::Exception { .. } | ElementKind::ExceptionRet => self.exception(),
            ElementKind::TraceOn(_) | ElementKind::NoSync(_) | ElementKind::EoTrace(_) => {
                self.break_chain();
                return true;
            }
            _ => {}
        }
        false
    }

    /// A discontinuity (trace on, no sync, end of trace, overflow): the chain breaks.
    #[inline]
    pub fn break_chain(&mut self) {
        *self = BranchRule::default();
    }

    /// A range came since the last discontinuity.
    #[inline]
    pub fn in_chain(&self) -> bool {
        self.prev.is_some()
    }

    /// The last range's own taken branch, whose record waits for the next range: (its
    /// address, its type). `None` when the last range did not end in a taken branch, or only
    /// an exception followed it (there is no branch target then).
    #[inline]
    pub fn pending(&self) -> Option<(u64, InstrType)> {
        self.prev.filter(|(_, ty)| self.prev_taken && !self.by_exception && matches!(ty, InstrType::Br | InstrType::BrIndirect))
    }
}

/// The taken branches of a stretch of one source's ranges (at least one), as a decoder hands
/// them to a sink that takes branches instead of ranges (`ElementSink::branches`): perf's rule
/// over the stretch from [`BranchRule::OPEN`], for the sink to [`join`](Self::join) to its
/// chain.
#[derive(Debug)]
pub struct BranchBatch<'a> {
    /// The records in order; the first is the stretch's first range's, its `from` the
    /// chain's to fill in, or its to drop.
    pub records: &'a mut [BranchRecord],
    /// The chain after the stretch's last range.
    pub end: BranchRule,
    /// Ranges in the stretch.
    pub ranges: u64,
    /// Trace index of the packet of its last range.
    pub last_index: u64,
}

impl BranchBatch<'_> {
    /// The records the stretch makes after `chain` (which then continues from its end): what
    /// [`BranchRule::range`] makes over its ranges.
    #[inline]
    pub fn join(&mut self, chain: &mut BranchRule) -> &[BranchRecord] {
        match chain.join(&self.end) {
            Some(from) => {
                if let Some(first) = self.records.first_mut() {
                    first.from = from;
                }
                self.records
            }
            None => self.records.get(1..).unwrap_or_default(),
        }
    }
}

/// Turns the elements of one trace source into branch records ([`BranchRule`]) and keeps the
/// last-branch ring up to date.
#[derive(Debug, Clone)]
pub struct BranchBuilder {
    rule: BranchRule,
    last: Option<InstrRange>,
    ring: BranchRing,
    /// Records produced.
    pub records: u64,
    /// Chain breaks (discontinuities).
    pub breaks: u64,
}

impl BranchBuilder {
    /// A builder with a ring of `depth` records.
    pub fn new(depth: usize) -> Self {
        BranchBuilder { rule: BranchRule::default(), last: None, ring: BranchRing::new(depth), records: 0, breaks: 0 }
    }

    /// The ring (newest first).
    pub fn ring(&self) -> &BranchRing {
        &self.ring
    }

    /// The last range seen since the last discontinuity, and whether it ended in a taken branch
    /// (or an exception followed it).
    pub fn last_range(&self) -> Option<(InstrRange, bool)> {
        self.last.map(|r| (r, self.rule.prev_taken))
    }

    /// Feeds one element; returns the branch record it completed, if any.
    pub fn element(&mut self, e: &Element) -> Option<BranchRecord> {
        match e.kind {
            ElementKind::InstrRange(r) => {
                self.last = Some(r);
                let rec = self.rule.range(&r);
                if let Some(rec) = rec {
                    self.ring.push(rec);
                    self.records += 1;
                }
                rec
            }
            ref kind => {
                if self.rule.other_element(kind) {
                    self.last = None;
                    self.ring.clear();
                    self.breaks += 1;
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elements::{Range, TraceOnReason, UnsyncReason};
    use crate::insn::{InstrSubtype, Isa};

    fn range(start: u64, end: u64, ty: InstrType, executed: bool) -> Element {
        Element {
            index: 0,
            trace_id: 1,
            kind: ElementKind::InstrRange(InstrRange {
                start,
                end,
                num_instr: ((end - start) / 4) as u32,
                isa: Isa::A64,
                last_size: 4,
                executed,
                last_type: ty,
                last_subtype: InstrSubtype::None,
                last_cond: false,
            }),
        }
    }

    /// A taken branch links the previous range's last instruction to the next range's start;
    /// a not-taken one does not.
    #[test]
    fn taken_and_not_taken() {
        let mut b = BranchBuilder::new(4);
        assert_eq!(b.element(&range(0x1000, 0x1008, InstrType::Br, true)), None);
        assert_eq!(b.element(&range(0x2000, 0x2010, InstrType::Br, false)), Some(BranchRecord { from: 0x1004, to: 0x2000 }));
        assert_eq!(b.element(&range(0x2010, 0x2014, InstrType::BrIndirect, true)), None);
        assert_eq!(b.element(&range(0x3000, 0x3004, InstrType::Other, true)), Some(BranchRecord { from: 0x2010, to: 0x3000 }));
        let v: Vec<_> = b.ring().iter().copied().collect();
        assert_eq!(v, vec![BranchRecord { from: 0x2010, to: 0x3000 }, BranchRecord { from: 0x1004, to: 0x2000 }]);
    }

    /// A discontinuity empties the ring and breaks the chain; an exception forces a record.
    #[test]
    fn discontinuity_and_exception() {
        let mut b = BranchBuilder::new(4);
        b.element(&range(0x1000, 0x1008, InstrType::Br, true));
        b.element(&Element { index: 0, trace_id: 1, kind: ElementKind::TraceOn(TraceOnReason::Normal) });
        assert!(b.ring().is_empty());
        assert_eq!(b.element(&range(0x2000, 0x2008, InstrType::Other, true)), None);
        b.element(&Element {
            index: 0,
            trace_id: 1,
            kind: ElementKind::Exception {
                ret_addr: 0x2008,
                ret_addr_valid: true,
                ret_addr_br_tgt: false,
                m_tail_chain: false,
                number: 14,
            },
        });
        assert_eq!(b.element(&range(0x8000, 0x8004, InstrType::Other, true)), Some(BranchRecord { from: 0x2004, to: 0x8000 }));
        b.element(&Element { index: 0, trace_id: 1, kind: ElementKind::NoSync(UnsyncReason::Overflow) });
        assert_eq!(b.ring().len(), 0);
    }

    /// The ring keeps only the newest `depth` records, newest first.
    #[test]
    fn ring_wraps() {
        let mut r = BranchRing::new(3);
        for i in 0..5u64 {
            r.push(BranchRecord { from: i, to: i + 100 });
        }
        let v: Vec<u64> = r.iter().map(|x| x.from).collect();
        assert_eq!(v, vec![4, 3, 2]);
        let mut out = [BranchRecord::default(); 8];
        assert_eq!(r.copy_to(&mut out), 3);
    }

    /// The rule over a run makes what it makes range by range: the same records, in order,
    /// and the same chain after, from every chain state before (none, after a taken or a
    /// not-taken branch, after an exception), over runs of every length cut from a sequence
    /// of taken, not-taken and non-branch ranges.
    #[test]
    fn run_as_range_by_range() {
        let types = [InstrType::Br, InstrType::BrIndirect, InstrType::Other, InstrType::Isb];
        let mut seq = Vec::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for i in 0..64u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let start = 0x1000 + 0x40 * i;
            let n = 1 + (x % 5);
            let ElementKind::InstrRange(r) = range(start, start + 4 * n, types[(x >> 8) as usize % 4], x & 0x10000 != 0).kind
            else {
                unreachable!()
            };
            seq.push(Range { index: i, range: r });
        }
        let befores: [fn(&mut BranchRule); 4] = [
            |_| {},
            |b| {
                b.range(&InstrRange { start: 0x10, end: 0x18, executed: true, last_type: InstrType::Br, ..Default::default() });
            },
            |b| {
                b.range(&InstrRange { start: 0x10, end: 0x18, executed: false, last_type: InstrType::Br, ..Default::default() });
            },
            |b| {
                b.range(&InstrRange {
                    start: 0x10,
                    end: 0x18,
                    executed: true,
                    last_type: InstrType::Other,
                    ..Default::default()
                });
                b.exception();
            },
        ];
        let mut made = 0;
        for before in befores {
            for at in 0..seq.len() {
                for len in 0..=(seq.len() - at).min(9) {
                    let run = &seq[at..at + len];
                    let (mut one, mut all) = (BranchRule::default(), BranchRule::default());
                    before(&mut one);
                    before(&mut all);
                    let want: Vec<BranchRecord> = run.iter().filter_map(|r| one.range(&r.range)).collect();
                    let mut out = vec![BranchRecord::default(); len];
                    let mut seen = Vec::new();
                    let k = all.ranges(run, &mut out, |i, r| seen.push((i, r.start)));
                    assert_eq!(&out[..k], &want[..], "run {at}+{len}");
                    assert_eq!(all, one, "chain after run {at}+{len}");
                    assert_eq!(seen, run.iter().enumerate().map(|(i, r)| (i, r.range.start)).collect::<Vec<_>>());
                    made += k;
                }
            }
        }
        assert!(made > 1000, "{made} records: too few taken branches to test anything");
    }
}
