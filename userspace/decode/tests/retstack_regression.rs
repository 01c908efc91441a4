//! Regression: a return compressed by the return stack (TRCCONFIGR.RS) pops the stack exactly
//! once. The decoder used to leave the "pop pending" flag set after the pop (OpenCSD's
//! `TrcAddrReturnStack::pop` clears it), so the *second* atom after a compressed `RET` popped
//! again, found the stack empty ("return stack overflow") and reported NO_SYNC [bad-packet].
//! Found with `etm-bpf synth` sessions (a tail call `BR` with an address packet, then a `RET`
//! to the caller without one, then more atoms), which OpenCSD 1.3.3 decodes to the ground truth.

use std::ops::ControlFlow;

use etm_decode::elements::{Element, ElementKind};
use etm_decode::frame::StreamFormat;
use etm_decode::image::{MemSpace, MemoryImage};
use etm_decode::insn::ArchVersion;
use etm_decode::pipeline::BufferDecoder;
use etm_decode::snapshot::{EtmConfig, Protocol};

const NOP: u32 = 0xD503_201F;

/// Code (A64, little endian):
/// ```text
/// 0x1000: bl  0x2000      (pushes 0x1004 on the return stack)
/// 0x1004: b   0x1010
/// 0x1010: b   0x1020
/// 0x2000: br  x16         (tail call to 0x3000: target sent as an address packet)
/// 0x3000: ret             (returns to 0x1004: target compressed away by the return stack)
/// ```
fn image() -> MemoryImage {
    let mut low = vec![NOP; 0x30 / 4];
    low[0] = 0x9400_0400; // bl +0x1000
    low[1] = 0x1400_0003; // b +0xc
    low[4] = 0x1400_0004; // b +0x10
    let words = |w: &[u32]| w.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
    let mut m = MemoryImage::new();
    m.add(0x1000, words(&low), MemSpace::ANY);
    m.add(0x2000, words(&[0xD61F_0200, NOP]), MemSpace::ANY); // br x16
    m.add(0x3000, words(&[0xD65F_03C0, NOP]), MemSpace::ANY); // ret
    m
}

/// The ETE configuration `etm-bpf synth` records (TRCCONFIGR = CID|TS|RS).
fn config() -> EtmConfig {
    let mut cfg = EtmConfig::generic(Protocol::Ete, 0x10);
    cfg.configr = 0x1840;
    cfg.idr[0] = 0x2880_06a1;
    cfg.idr[1] = 0x4100_fff0;
    cfg.idr[2] = 0xc000_1088;
    cfg.idr[8] = 0;
    cfg.devarch = 0x4771_5a13;
    cfg
}

/// Hand-encoded ETE stream (DDI 0608 / IHI 0064 packet formats, etm-interface.md §3.3-3.5):
/// ```text
/// 00 x11, 80                      A-sync
/// 01 00                           Trace Info (INFO 0): address history = 0, stack flushed
/// 04                              Trace On
/// 82 00 08 00 00 b0 92 10 00 00   Address+Context, long 32-bit IS0: addr[8:2]=0x00,
///                                 addr[15:9]=0x08 -> 0x1000; ctx EL0, SF, NS, CID 0x1092
/// db                              Atom F2, bits 1:0 = 0b11: E (bl 0x2000), E (br x16)
/// 95 80 18                        Short address IS0: addr[8:2]=0 (+cont), addr[16:9]=0x18
///                                 -> 0x3000 (upper bits from history 0x1000); the br target
/// ff                              Atom F3, bits 2:0 = 0b111: E (ret, no address packet:
///                                 pop 0x1004), E (b 0x1010), E (b 0x1020)
/// ```
const TRACE: [u8; 30] = [
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80, //
    0x01, 0x00, //
    0x04, //
    0x82, 0x00, 0x08, 0x00, 0x00, 0xb0, 0x92, 0x10, 0x00, 0x00, //
    0xdb, //
    0x95, 0x80, 0x18, //
    0xff,
];

fn decode(cfg: EtmConfig) -> (Vec<(u64, u64, bool)>, usize) {
    let img = image();
    let mut dec = BufferDecoder::new(StreamFormat::Raw { trace_id: 0x10 }, &[(0x10, cfg, ArchVersion::Aa64)]);
    let mut ranges = Vec::new();
    let mut nosync = 0;
    let mut sink = |e: &Element| {
        match &e.kind {
            ElementKind::InstrRange(r) => ranges.push((r.start, r.end, r.executed)),
            ElementKind::NoSync(_) => nosync += 1,
            _ => {}
        }
        ControlFlow::Continue(())
    };
    let _ = dec.push(&TRACE, &img, &mut sink);
    let _ = dec.finish(&img, &mut sink);
    (ranges, nosync)
}

/// The compressed RET returns to the instruction after the BL, and the two atoms after it
/// walk the two direct branches there: every range of the hand decode, and no NO_SYNC beyond
/// the initial one.
#[test]
fn compressed_return_pops_once() {
    let (ranges, nosync) = decode(config());
    assert_eq!(
        ranges,
        vec![
            (0x1000, 0x1004, true), // bl 0x2000
            (0x2000, 0x2004, true), // br x16 -> 0x3000 (address packet)
            (0x3000, 0x3004, true), // ret -> 0x1004 (return stack)
            (0x1004, 0x1008, true), // b 0x1010
            (0x1010, 0x1014, true), // b 0x1020
        ]
    );
    assert_eq!(nosync, 1, "only the initial NO_SYNC [init-decoder]");
}
