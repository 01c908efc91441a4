//! ETE packet encoder (Arm Embedded Trace Extension, DDI 0608; the instruction-trace packets
//! are those of ETMv4, IHI 0064, chapter 6). Written from the packet tables in
//! `../shared/docs/etm-interface.md` §3.3–3.6, not from our decoder.
//!
//! The encoder models the trace unit state that affects the byte stream:
//!
//! * the 3-entry **address history** (§3.4): every address packet, including exact-match and
//!   address-with-context packets, pushes its address; Trace Info resets all entries to 0. An
//!   address equal to entry k is sent as exact match `0x90+k`; otherwise the smallest of
//!   short (`0x95`, 7 or 15 bits above bit 2 replaced in the most recent address), long-32
//!   (`0x9A`, when bits 63:32 equal the most recent address) and long-64 (`0x9D`);
//! * the **return stack** (TRCCONFIGR.RS, §4): `BL`/`BLR` push the return address; a taken
//!   indirect branch whose target equals the top of the stack pops it and sends *no* target
//!   address; Trace Info and Trace On flush it;
//! * **atoms** are buffered and packed into the atom formats (§3.5) whenever another packet
//!   must follow them: a run of 3–23 E atoms plus one final E or N as format 6, the fixed
//!   5- and 4-atom patterns as formats 5 and 4, otherwise formats 3, 2, 1;
//! * **timestamps** (`0x02`): the value's low bits that differ from the previous timestamp,
//!   7 bits per byte with continuation, a 9th byte carrying 8 bits (§3.3).
//!
//! Speculation is not modelled: the configuration has TRCIDR8.MAXSPEC = 0, so every P0 element
//! is committed at once and no Commit packets are needed.

use std::collections::VecDeque;

/// Packet headers (IHI 0064 table 6-2 / DDI 0608).
pub mod hdr {
    /// Trace Info.
    pub const TRACE_INFO: u8 = 0x01;
    /// Timestamp without cycle count.
    pub const TIMESTAMP: u8 = 0x02;
    /// Trace On.
    pub const TRACE_ON: u8 = 0x04;
    /// Exception.
    pub const EXCEPTION: u8 = 0x06;
    /// Context (with payload).
    pub const CONTEXT: u8 = 0x81;
    /// Address, long 32-bit, IS0, with context.
    pub const ADDR_CTXT_L32_IS0: u8 = 0x82;
    /// Address, long 64-bit, IS0, with context.
    pub const ADDR_CTXT_L64_IS0: u8 = 0x85;
    /// Exact-match address, history entry 0 (+1, +2).
    pub const ADDR_MATCH: u8 = 0x90;
    /// Short address, IS0.
    pub const ADDR_S_IS0: u8 = 0x95;
    /// Long address 32-bit, IS0.
    pub const ADDR_L32_IS0: u8 = 0x9A;
    /// Long address 64-bit, IS0.
    pub const ADDR_L64_IS0: u8 = 0x9D;
    /// Atom format 1 (bit 0 = the atom).
    pub const ATOM_F1: u8 = 0xF6;
    /// Atom format 2 (bits 1:0).
    pub const ATOM_F2: u8 = 0xD8;
    /// Atom format 3 (bits 2:0).
    pub const ATOM_F3: u8 = 0xF8;
    /// Ignore (TRBE padding).
    pub const IGNORE: u8 = 0x70;
}

/// The A-sync packet: eleven 0x00 then 0x80.
pub const A_SYNC: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80];

/// Atom format 4 headers and their 4-atom patterns (bit 0 = oldest, 1 = E).
pub const ATOM_F4: [(u8, u8); 4] = [(0xDC, 0b1110), (0xDD, 0b0000), (0xDE, 0b1010), (0xDF, 0b0101)];
/// Atom format 5 headers and their 5-atom patterns (bit 0 = oldest, 1 = E).
pub const ATOM_F5: [(u8, u8); 4] = [(0xF5, 0b11110), (0xD5, 0b00000), (0xD6, 0b01010), (0xD7, 0b10101)];
/// Atom format 6: `n` E atoms (3..=23) then a final atom: header `0xC0 | (n-3)` for a final
/// E, `0xE0 | (n-3)` for a final N.
pub const ATOM_F6_MAX_E: usize = 23;

/// ETMv4/ETE exception type "Call" (SVC/HVC/SMC), IHI 0064 table 6-12.
pub const EXCEPTION_CALL: u8 = 2;
/// ETMv4/ETE exception type "IRQ" (IHI 0064 table 6-12): the timer interrupt that preempts a
/// task.
pub const EXCEPTION_IRQ: u8 = 14;

/// Execution context sent in address-with-context packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Context {
    /// Exception level (0 for user space).
    pub el: u8,
    /// Non-secure.
    pub ns: bool,
    /// AArch64 (SF).
    pub sf: bool,
    /// CONTEXTIDR value when context-ID tracing is on (TRCCONFIGR.CID; 32-bit, TRCIDR2.CIDSIZE = 4).
    pub context_id: Option<u32>,
}

impl Context {
    /// The context information byte (§3.3 context packet).
    pub fn info_byte(&self) -> u8 {
        (self.el & 3)
            | if self.sf { 1 << 4 } else { 0 }
            | if self.ns { 1 << 5 } else { 0 }
            | if self.context_id.is_some() { 1 << 7 } else { 0 }
    }
}

/// Encoder configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncoderConfig {
    /// Return-stack compression (TRCCONFIGR.RS).
    pub retstack: bool,
    /// Depth of the modelled return stack (implementation defined; OpenCSD's decoder keeps 16).
    pub retstack_depth: usize,
}

impl Default for EncoderConfig {
    fn default() -> Self {
        EncoderConfig { retstack: true, retstack_depth: 16 }
    }
}

/// Counters of emitted packets (for tests and the ground truth).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncoderStats {
    /// Atoms emitted.
    pub atoms: u64,
    /// Atom packets emitted.
    pub atom_packets: u64,
    /// Plain address packets (exact, short, long) emitted.
    pub addresses: u64,
    /// Of which exact match.
    pub exact_match: u64,
    /// Of which short.
    pub short: u64,
    /// Indirect targets not sent thanks to the return stack.
    pub retstack_hits: u64,
}

/// An ETE byte-stream encoder with the trace unit's compression state.
#[derive(Debug, Clone)]
pub struct Encoder {
    cfg: EncoderConfig,
    out: Vec<u8>,
    atoms: Vec<bool>,
    hist: [u64; 3],
    retstack: VecDeque<u64>,
    last_ts: u64,
    /// Counters.
    pub stats: EncoderStats,
}

impl Encoder {
    /// A new encoder (address history and return stack empty).
    pub fn new(cfg: EncoderConfig) -> Self {
        Encoder {
            cfg,
            out: Vec::new(),
            atoms: Vec::new(),
            hist: [0; 3],
            retstack: VecDeque::new(),
            last_ts: 0,
            stats: EncoderStats::default(),
        }
    }

    /// Bytes so far (pending atoms flushed).
    pub fn finish(mut self) -> Vec<u8> {
        self.flush_atoms();
        self.out
    }

    /// Bytes emitted so far, without pending atoms.
    pub fn bytes(&self) -> &[u8] {
        &self.out
    }

    /// Takes the bytes emitted so far (pending atoms stay), keeping the trace unit's state: a
    /// sink receives the stream while the trace unit goes on.
    pub fn take_bytes(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// A-sync (12 bytes).
    pub fn a_sync(&mut self) {
        self.flush_atoms();
        self.out.extend_from_slice(&A_SYNC);
    }

    /// Trace Info with no optional sections (PLCTL = 0: no cycle counting, speculation depth 0).
    /// Resets the address history and flushes the return stack; the next timestamp is sent in
    /// full.
    pub fn trace_info(&mut self) {
        self.flush_atoms();
        self.out.extend_from_slice(&[hdr::TRACE_INFO, 0x00]);
        self.hist = [0; 3];
        self.retstack.clear();
        self.last_ts = 0;
    }

    /// Trace On (a discontinuity); flushes the return stack.
    pub fn trace_on(&mut self) {
        self.flush_atoms();
        self.out.push(hdr::TRACE_ON);
        self.retstack.clear();
    }

    /// Timestamp packet for counter value `ts`.
    pub fn timestamp(&mut self, ts: u64) {
        self.flush_atoms();
        self.out.push(hdr::TIMESTAMP);
        encode_ts(&mut self.out, ts, self.last_ts);
        self.last_ts = ts;
    }

    /// Address with context (used after Trace On): long 32-bit when bits 63:32 equal the most
    /// recent address, else long 64-bit.
    pub fn address_with_context(&mut self, addr: u64, ctx: &Context) {
        self.flush_atoms();
        if addr >> 32 == self.hist[0] >> 32 {
            self.out.push(hdr::ADDR_CTXT_L32_IS0);
            long_is0(&mut self.out, addr, 4);
        } else {
            self.out.push(hdr::ADDR_CTXT_L64_IS0);
            long_is0(&mut self.out, addr, 8);
        }
        self.out.push(ctx.info_byte());
        if let Some(cid) = ctx.context_id {
            self.out.extend_from_slice(&cid.to_le_bytes());
        }
        self.push_hist(addr);
    }

    /// A plain address packet, compressed against the history.
    pub fn address(&mut self, addr: u64) {
        self.flush_atoms();
        self.stats.addresses += 1;
        if let Some(k) = self.hist.iter().position(|&h| h == addr) {
            self.out.push(hdr::ADDR_MATCH + k as u8);
            self.stats.exact_match += 1;
        } else if addr >> 9 == self.hist[0] >> 9 {
            self.out.extend_from_slice(&[hdr::ADDR_S_IS0, ((addr >> 2) & 0x7F) as u8]);
            self.stats.short += 1;
        } else if addr >> 17 == self.hist[0] >> 17 {
            self.out.extend_from_slice(&[hdr::ADDR_S_IS0, 0x80 | ((addr >> 2) & 0x7F) as u8, (addr >> 9) as u8]);
            self.stats.short += 1;
        } else if addr >> 32 == self.hist[0] >> 32 {
            self.out.push(hdr::ADDR_L32_IS0);
            long_is0(&mut self.out, addr, 4);
        } else {
            self.out.push(hdr::ADDR_L64_IS0);
            long_is0(&mut self.out, addr, 8);
        }
        self.push_hist(addr);
    }

    /// One atom (E = `taken`).
    pub fn atom(&mut self, taken: bool) {
        self.atoms.push(taken);
        self.stats.atoms += 1;
    }

    /// A taken branch: its E atom, the return-stack push for a link branch, and for an
    /// indirect branch the target address unless the return stack predicts it.
    pub fn branch(&mut self, indirect: bool, link: bool, pc: u64, target: u64) {
        self.atom(true);
        if link && self.cfg.retstack {
            self.retstack.push_front(pc.wrapping_add(4));
            self.retstack.truncate(self.cfg.retstack_depth);
        }
        if indirect {
            if self.cfg.retstack && self.retstack.front() == Some(&target) {
                self.retstack.pop_front();
                self.stats.retstack_hits += 1;
            } else {
                self.address(target);
            }
        }
    }

    /// An exception (type `ty`, e.g. [`EXCEPTION_CALL`]) with its preferred return address.
    pub fn exception(&mut self, ty: u8, ret_addr: u64) {
        self.flush_atoms();
        // Info byte: bit0 E0 = 1 (address follows), bits 5:1 TYPE[4:0], bit6 E1 = 0, no cont.
        self.out.extend_from_slice(&[hdr::EXCEPTION, 1 | ((ty & 0x1F) << 1)]);
        self.address(ret_addr);
    }

    fn push_hist(&mut self, addr: u64) {
        self.hist = [addr, self.hist[0], self.hist[1]];
    }

    /// Emit all buffered atoms as atom packets.
    pub fn flush_atoms(&mut self) {
        let mut i = 0;
        let a = std::mem::take(&mut self.atoms);
        while i < a.len() {
            let (byte, n) = pack_atoms(&a[i..]);
            self.out.push(byte);
            self.stats.atom_packets += 1;
            i += n;
        }
        self.atoms = a;
        self.atoms.clear();
    }
}

/// Choose one atom packet for the start of `atoms` (oldest first, E = true): returns the header
/// byte and how many atoms it carries.
pub fn pack_atoms(atoms: &[bool]) -> (u8, usize) {
    let run = atoms.iter().take_while(|&&e| e).count();
    // Format 6: n E atoms (3..=23) + a final atom.
    if run >= 3 {
        if run <= ATOM_F6_MAX_E && run < atoms.len() {
            // The atom after the run is N.
            return (0xE0 | (run - 3) as u8, run + 1);
        }
        if run >= 4 {
            let n = (run - 1).min(ATOM_F6_MAX_E);
            return (0xC0 | (n - 3) as u8, n + 1);
        }
    }
    let bits = |k: usize| atoms[..k].iter().enumerate().fold(0u8, |b, (i, &e)| b | ((e as u8) << i));
    if atoms.len() >= 5 {
        let b = bits(5);
        if let Some(&(h, _)) = ATOM_F5.iter().find(|&&(_, p)| p == b) {
            return (h, 5);
        }
    }
    if atoms.len() >= 4 {
        let b = bits(4);
        if let Some(&(h, _)) = ATOM_F4.iter().find(|&&(_, p)| p == b) {
            return (h, 4);
        }
    }
    match atoms.len() {
        0 => unreachable!("pack_atoms called with no atoms"),
        1 => (hdr::ATOM_F1 | bits(1), 1),
        2 => (hdr::ATOM_F2 | bits(2), 2),
        _ => (hdr::ATOM_F3 | bits(3), 3),
    }
}

/// Long IS0 address bytes: b0 = addr[8:2], b1 = addr[15:9], then whole bytes up to `size` (4 or 8).
fn long_is0(out: &mut Vec<u8>, addr: u64, size: usize) {
    out.push(((addr >> 2) & 0x7F) as u8);
    out.push(((addr >> 9) & 0x7F) as u8);
    for k in 2..size {
        out.push((addr >> (8 * k)) as u8);
    }
}

/// Timestamp field: enough low bits of `ts` to cover every bit that differs from `prev`
/// (at least one byte), 7 bits per byte with bit 7 = continuation, a 9th byte of 8 bits.
fn encode_ts(out: &mut Vec<u8>, ts: u64, prev: u64) {
    let diff = ts ^ prev;
    let bits = 64 - diff.leading_zeros() as usize;
    let nbytes = if bits > 56 { 9 } else { bits.div_ceil(7).max(1) };
    for k in 0..nbytes.min(8) {
        let v = ((ts >> (7 * k)) & 0x7F) as u8;
        out.push(if k + 1 < nbytes { v | 0x80 } else { v });
    }
    if nbytes == 9 {
        out.push((ts >> 56) as u8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Atom headers match bytes read from real ETE captures with their listed meaning
    /// (ete_ip session1.bin: 0xf7 = E, 0xdb = EE, 0xfb = EEN, 0xdc = NEEE, 0xf5 = NEEEE,
    /// 0xd6 = NENEN, 0xc1 = EEEEE; ete_spec_1: 0xc2 = 6 x E; perf_with_unformatted_trace:
    /// 0xd4 = 24 x E).
    #[test]
    fn atom_formats_match_captures() {
        let e = |s: &str| s.chars().map(|c| c == 'E').collect::<Vec<bool>>();
        assert_eq!(pack_atoms(&e("E")), (0xF7, 1));
        assert_eq!(pack_atoms(&e("EE")), (0xDB, 2));
        assert_eq!(pack_atoms(&e("EEN")), (0xFB, 3));
        assert_eq!(pack_atoms(&e("NEEE")), (0xDC, 4));
        assert_eq!(pack_atoms(&e("NEEEE")), (0xF5, 5));
        assert_eq!(pack_atoms(&e("NENEN")), (0xD6, 5));
        assert_eq!(pack_atoms(&e("EEEEE")), (0xC1, 5));
        assert_eq!(pack_atoms(&e("EEEEEE")), (0xC2, 6));
        assert_eq!(pack_atoms(&e(&"E".repeat(30))), (0xD4, 24));
        // perf_with_unformatted_trace idx 62: "EEEEEEEEEN" = F6 with 9 E + final N.
        assert_eq!(pack_atoms(&e("EEEEEEEEEN")), (0xE6, 10));
    }

    /// Every atom sequence packs into packets that, decoded with the §3.5 table, give back
    /// the same atoms.
    #[test]
    fn atom_packing_round_trips() {
        fn decode(h: u8) -> Vec<bool> {
            let bits = |p: u32, n: usize| (0..n).map(|i| p >> i & 1 == 1).collect::<Vec<_>>();
            match h {
                0xF6 | 0xF7 => bits(h as u32 & 1, 1),
                0xD8..=0xDB => bits(h as u32 & 3, 2),
                0xF8..=0xFF => bits(h as u32 & 7, 3),
                0xDC..=0xDF => bits([0b1110, 0b0000, 0b1010, 0b0101][(h & 3) as usize], 4),
                0xF5 => bits(0b11110, 5),
                0xD5..=0xD7 => bits([0, 0b00000, 0b01010, 0b10101][(h & 3) as usize], 5),
                0xC0..=0xD4 | 0xE0..=0xF4 => {
                    let n = (h & 0x1F) as usize + 3;
                    let mut v = vec![true; n];
                    v.push(h & 0x20 == 0);
                    v
                }
                _ => panic!("not an atom header {h:#x}"),
            }
        }
        // Pseudo-random sequences with long E runs.
        let mut x = 0x1234_5678u32;
        for len in 1..200 {
            let atoms: Vec<bool> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    !x.is_multiple_of(5)
                })
                .collect();
            let mut enc = Encoder::new(EncoderConfig::default());
            for &a in &atoms {
                enc.atom(a);
            }
            let out = enc.finish();
            let back: Vec<bool> = out.iter().flat_map(|&h| decode(h)).collect();
            assert_eq!(back, atoms, "len {len}");
        }
    }

    /// Address packets match captured bytes: long-32 `9a 46 3f 05 00` = 0x57F18 (ete_ip idx 22),
    /// 64-bit `9d 5f 3f b7 9f 75 00 00 00` = 0x759FB77F7C and address-with-context
    /// `85 00 18 29 9b 62 00 00 00 ..` = 0x629B293000 (perf_with_unformatted_trace idx 30, 15),
    /// 2-byte short `95 ca 1e` replacing bits 16:2 (ete_spec_1 idx 40: 0x63D28, listed `~[0x3D28]`;
    /// the previous address, here 0x6AB90, shares bits 63:17).
    #[test]
    fn address_packets_match_captures() {
        let mut enc = Encoder::new(EncoderConfig::default());
        enc.address(0x57F18);
        assert_eq!(enc.bytes(), [0x9a, 0x46, 0x3f, 0x05, 0x00]);

        let mut enc = Encoder::new(EncoderConfig::default());
        enc.address(0x75_9FB7_7F7C);
        assert_eq!(enc.bytes(), [0x9d, 0x5f, 0x3f, 0xb7, 0x9f, 0x75, 0, 0, 0]);

        let mut enc = Encoder::new(EncoderConfig::default());
        let ctx = Context { el: 0, ns: true, sf: true, context_id: None };
        enc.address_with_context(0x62_9B29_3000, &ctx);
        assert_eq!(enc.bytes(), [0x85, 0x00, 0x18, 0x29, 0x9b, 0x62, 0, 0, 0, 0x30]);

        let mut enc = Encoder::new(EncoderConfig::default());
        enc.address(0x6AB90);
        let n = enc.bytes().len();
        enc.address(0x63D28);
        assert_eq!(&enc.bytes()[n..], [0x95, 0xca, 0x1e]);
    }

    /// Window-start packets match captures: A-sync, Trace Info `01 00`, Trace On `04` and
    /// address-with-context `82 2e 08 0a 00 11` = 0xA10B8, AArch64 EL1 secure (ete_ip idx 0-15);
    /// with a context ID the 4 CONTEXTIDR bytes follow the info byte, little endian
    /// (trace_file_cid_vmid idx 15: `82 6e 08 0a 00 f1 <vmid 4> 00 43 00 00` = CID 0x4300; we
    /// trace no VMID, so the info byte is 0xb1 and the CID follows it directly).
    #[test]
    fn window_start_packets_match_captures() {
        let mut enc = Encoder::new(EncoderConfig::default());
        enc.a_sync();
        enc.trace_info();
        enc.trace_on();
        enc.address_with_context(0xA10B8, &Context { el: 1, ns: false, sf: true, context_id: None });
        let mut want = A_SYNC.to_vec();
        want.extend_from_slice(&[0x01, 0x00, 0x04, 0x82, 0x2e, 0x08, 0x0a, 0x00, 0x11]);
        assert_eq!(enc.bytes(), &want[..]);

        let mut enc = Encoder::new(EncoderConfig::default());
        enc.address_with_context(0xA11B8, &Context { el: 1, ns: true, sf: true, context_id: Some(0x4300) });
        assert_eq!(enc.bytes(), [0x82, 0x6e, 0x08, 0x0a, 0x00, 0xb1, 0x00, 0x43, 0x00, 0x00]);
    }

    /// History: a repeated address is an exact match on its history entry, a nearby one a
    /// 1-byte short address, and Trace Info resets the history to zero.
    #[test]
    fn address_history() {
        let mut enc = Encoder::new(EncoderConfig::default());
        enc.address(0x40_1000); // long-32
        enc.address(0x40_1040); // short, 1 byte: bits 8:2 = 0x10
        enc.address(0x40_1000); // exact match [1]
        let b = enc.bytes().to_vec();
        assert_eq!(&b[5..], [0x95, 0x10, 0x91]);
        enc.trace_info();
        let n = enc.bytes().len();
        enc.address(0x40_1000); // history is 0 again: long-32, not a match
        assert_eq!(enc.bytes()[n], 0x9a);
    }

    /// Timestamps: `02 d7 df 01` = 0x6fd7 (ts_marker idx 22); a later value only sends the
    /// changed low bits.
    #[test]
    fn timestamp_encoding() {
        let mut enc = Encoder::new(EncoderConfig::default());
        enc.timestamp(0x6fd7);
        assert_eq!(enc.bytes(), [0x02, 0xd7, 0xdf, 0x01]);
        enc.timestamp(0x6fd8);
        assert_eq!(&enc.bytes()[4..], [0x02, 0x58]);
        enc.timestamp(0x8000);
        assert_eq!(&enc.bytes()[6..], [0x02, 0x80, 0x80, 0x02]);
        let mut enc = Encoder::new(EncoderConfig::default());
        enc.timestamp(u64::MAX - 1);
        assert_eq!(enc.bytes().len(), 10);
        assert_eq!(enc.bytes()[9], 0xff);
    }

    /// An SVC is `06 05` ("Call; Ret Addr Follows", ete_ip idx 282) followed by the return
    /// address.
    #[test]
    fn exception_packet() {
        let mut enc = Encoder::new(EncoderConfig::default());
        enc.exception(EXCEPTION_CALL, 0x1000);
        assert_eq!(&enc.bytes()[..2], [0x06, 0x05]);
    }

    /// With return-stack compression a return to the address pushed by the matching call
    /// sends no address; without it the target is sent.
    #[test]
    fn return_stack_compression() {
        for rs in [true, false] {
            let mut enc = Encoder::new(EncoderConfig { retstack: rs, retstack_depth: 16 });
            enc.branch(false, true, 0x1000, 0x2000); // bl
            enc.branch(true, false, 0x2010, 0x1004); // ret
            let out = enc.finish();
            if rs {
                assert_eq!(out, [0xDB]);
            } else {
                // 0x1004 against an empty (zero) history: 2-byte short address.
                assert_eq!(out, [0xDB, 0x95, 0x81, 0x08]);
            }
        }
    }
}
