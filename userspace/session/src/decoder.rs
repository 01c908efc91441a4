//! Trace decoders behind [`WindowDecoder`]: the `etm_decode` adapter (the real one) and
//! [`toy::ToyDecoder`], a test double with a trivial byte format used to test the pipeline's
//! fault handling independently of the ETM decoder.

use std::ops::ControlFlow;
use std::sync::Arc;

use etm_decode::branches::BranchBuilder;
use etm_decode::decoder::ElementSink;
use etm_decode::elements::{Element, ElementKind, TraceOnReason, UnsyncReason};
use etm_decode::frame::StreamFormat;
use etm_decode::image::{MemSpace, MemoryAccess};
use etm_decode::insn::ArchVersion;
use etm_decode::pipeline::BufferDecoder;
use etm_decode::snapshot::{CoreProfile, EtmConfig, Protocol};

use crate::pipeline::{CodeMap, DecoderFactory, Discontinuity, WindowDecoder, WindowSink};
use crate::session::{CpuTraceConfig, TraceArch};

/// The default decoder factory: [`EtmFactory`].
pub fn default_factory() -> Option<Arc<dyn DecoderFactory>> {
    Some(Arc::new(EtmFactory))
}

/// The `etm_decode` decoder configuration of a CPU's trace unit (perf AUXTRACE_INFO values).
pub fn etm_config(c: &CpuTraceConfig) -> EtmConfig {
    let mut idr = [0u32; 14];
    idr[0] = c.trcidr0;
    idr[1] = c.trcidr1;
    idr[2] = c.trcidr2;
    idr[8] = c.trcidr8;
    let protocol = match c.arch {
        TraceArch::Ete => Protocol::Ete,
        TraceArch::Etmv4 => Protocol::Etmv4,
    };
    let devarch = match (c.trcdevarch, protocol) {
        (0, Protocol::Ete) => 0x4770_5A13,
        (v, _) => v,
    };
    EtmConfig {
        protocol,
        core_profile: CoreProfile::A,
        configr: c.trcconfigr,
        traceidr: u32::from(c.trace_id),
        idr,
        authstatus: c.trcauthstatus,
        devarch,
    }
}

/// Creates [`EtmWindowDecoder`]s.
#[derive(Debug, Default)]
pub struct EtmFactory;

impl DecoderFactory for EtmFactory {
    fn create(&self, aux_cpu: i32, cpus: &[CpuTraceConfig], raw: bool) -> Box<dyn WindowDecoder> {
        Box::new(EtmWindowDecoder::new(aux_cpu, cpus, raw))
    }
}

/// The real decoder for one AUX buffer: `etm_decode`'s deformatter, packet parser and element
/// decoder, with branch records built from the elements by perf's rules
/// (`etm_decode::branches::BranchBuilder`).
pub struct EtmWindowDecoder {
    format: StreamFormat,
    sources: Vec<(u8, EtmConfig, ArchVersion)>,
    buf: BufferDecoder,
    /// Per trace ID (index), the branch builder.
    builders: Vec<Option<BranchBuilder>>,
    raw: bool,
}

impl EtmWindowDecoder {
    /// A decoder for the buffer of `aux_cpu`. Raw data belongs to that CPU's trace unit
    /// (TRBE); formatted data is demultiplexed by trace ID.
    pub fn new(aux_cpu: i32, cpus: &[CpuTraceConfig], raw: bool) -> Self {
        let sources: Vec<(u8, EtmConfig, ArchVersion)> = if raw {
            cpus.iter()
                .find(|c| c.cpu == aux_cpu)
                .or(cpus.first())
                .map(|c| vec![(c.trace_id, etm_config(c), ArchVersion::Aa64)])
                .unwrap_or_default()
        } else {
            cpus.iter().map(|c| (c.trace_id, etm_config(c), ArchVersion::Aa64)).collect()
        };
        let format = match (raw, sources.first()) {
            (true, Some(s)) => StreamFormat::Raw { trace_id: s.0 },
            (true, None) => StreamFormat::Raw { trace_id: 0x10 },
            (false, _) => StreamFormat::Coresight,
        };
        let buf = BufferDecoder::new(format, &sources);
        let mut builders: Vec<Option<BranchBuilder>> = (0..128).map(|_| None).collect();
        for s in &sources {
            builders[(s.0 & 0x7f) as usize] = Some(BranchBuilder::new(1));
        }
        EtmWindowDecoder { format, sources, buf, builders, raw }
    }
}

/// Bridges the code map to the decoder's memory interface (the target process's code).
struct Mem<'a>(&'a CodeMap);

impl MemoryAccess for Mem<'_> {
    fn read(&self, addr: u64, _space: MemSpace, buf: &mut [u8]) -> usize {
        match self.0.slice(None, addr) {
            Some(s) => {
                let n = s.len().min(buf.len());
                buf[..n].copy_from_slice(&s[..n]);
                n
            }
            None => 0,
        }
    }
    fn slice_at(&self, addr: u64, _space: MemSpace) -> Option<&[u8]> {
        self.0.slice(None, addr)
    }
}

struct Elems<'a> {
    builders: &'a mut [Option<BranchBuilder>],
    sink: &'a mut dyn WindowSink,
    raw: bool,
}

impl ElementSink for Elems<'_> {
    fn element(&mut self, e: &Element) -> ControlFlow<()> {
        let id = if self.raw { None } else { Some(e.trace_id) };
        match e.kind {
            ElementKind::TraceOn(r) => {
                if r == TraceOnReason::Overflow {
                    self.sink.discontinuity(id, Discontinuity::Overflow);
                }
                self.sink.trace_on(id);
            }
            ElementKind::NoSync(r) => {
                let why = match r {
                    UnsyncReason::Overflow => Discontinuity::Overflow,
                    UnsyncReason::BadPacket => Discontinuity::Error,
                    UnsyncReason::BadImage => Discontinuity::Error,
                    _ => Discontinuity::NoSync,
                };
                self.sink.discontinuity(id, why);
            }
            ElementKind::AddrNacc { .. } => self.sink.discontinuity(id, Discontinuity::NoCode),
            ElementKind::Timestamp { ts, .. } => self.sink.timestamp(id, ts),
            _ => {}
        }
        if let Some(b) = self.builders.get_mut((e.trace_id & 0x7f) as usize).and_then(|b| b.as_mut())
            && let Some(r) = b.element(e)
        {
            self.sink.branch(id, r.from, r.to);
        }
        ControlFlow::Continue(())
    }
}

impl WindowDecoder for EtmWindowDecoder {
    fn feed(&mut self, data: &[u8], code: &CodeMap, sink: &mut dyn WindowSink) {
        let mut es = Elems { builders: &mut self.builders, sink, raw: self.raw };
        let _ = self.buf.push(data, &Mem(code), &mut es);
    }

    fn reset(&mut self) {
        self.buf = BufferDecoder::new(self.format, &self.sources);
        for b in self.builders.iter_mut().flatten() {
            *b = BranchBuilder::new(1);
        }
    }

    fn finish(&mut self, code: &CodeMap, sink: &mut dyn WindowSink) {
        let mut es = Elems { builders: &mut self.builders, sink, raw: self.raw };
        let _ = self.buf.finish(&Mem(code), &mut es);
    }
}

pub mod toy {
    //! A test double for [`WindowDecoder`](crate::pipeline::WindowDecoder): a tiny resumable
    //! packet format with a sync marker, so tests can inject truncation, lost data, flipped
    //! bytes and missing sync and check the pipeline's handling. Format:
    //!
    //! * `A5 A5` sync (the decoder ignores everything until it has seen one);
    //! * `01` trace on; `02 <u64 le>` timestamp; `03 <u64 from> <u64 to>` taken branch;
    //!   `04` overflow; any other byte is an error (the decoder loses sync).

    use crate::pipeline::{CodeMap, DecoderFactory, Discontinuity, WindowDecoder, WindowSink};
    use crate::session::CpuTraceConfig;

    /// Encoder for the toy format.
    #[derive(Debug, Default, Clone)]
    pub struct ToyWriter(pub Vec<u8>);

    impl ToyWriter {
        /// Sync marker.
        pub fn sync(&mut self) -> &mut Self {
            self.0.extend_from_slice(&[0xA5, 0xA5]);
            self
        }
        /// Trace on.
        pub fn trace_on(&mut self) -> &mut Self {
            self.0.push(1);
            self
        }
        /// Timestamp.
        pub fn ts(&mut self, t: u64) -> &mut Self {
            self.0.push(2);
            self.0.extend_from_slice(&t.to_le_bytes());
            self
        }
        /// Branch.
        pub fn branch(&mut self, from: u64, to: u64) -> &mut Self {
            self.0.push(3);
            self.0.extend_from_slice(&from.to_le_bytes());
            self.0.extend_from_slice(&to.to_le_bytes());
            self
        }
        /// Overflow.
        pub fn overflow(&mut self) -> &mut Self {
            self.0.push(4);
            self
        }
    }

    /// The toy decoder.
    #[derive(Debug, Default)]
    pub struct ToyDecoder {
        synced: bool,
        /// Bytes of an incomplete packet carried to the next chunk.
        partial: Vec<u8>,
        /// Whether the last byte seen while unsynced was 0xA5.
        half_sync: bool,
        reported_gap: bool,
    }

    fn need(op: u8) -> usize {
        match op {
            2 => 9,
            3 => 17,
            _ => 1,
        }
    }

    impl ToyDecoder {
        fn packet(&mut self, p: &[u8], sink: &mut dyn WindowSink) {
            let u = |i: usize| u64::from_le_bytes(p[i..i + 8].try_into().expect("8 bytes"));
            match p[0] {
                1 => sink.trace_on(None),
                2 => sink.timestamp(None, u(1)),
                3 => sink.branch(None, u(1), u(9)),
                4 => sink.discontinuity(None, Discontinuity::Overflow),
                _ => unreachable!("checked by the caller"),
            }
        }
    }

    impl WindowDecoder for ToyDecoder {
        fn feed(&mut self, data: &[u8], _code: &CodeMap, sink: &mut dyn WindowSink) {
            let mut i = 0;
            while i < data.len() {
                if !self.synced {
                    if !self.reported_gap {
                        sink.discontinuity(None, Discontinuity::NoSync);
                        self.reported_gap = true;
                    }
                    let b = data[i];
                    i += 1;
                    if b == 0xA5 && self.half_sync {
                        self.synced = true;
                        self.half_sync = false;
                    } else {
                        self.half_sync = b == 0xA5;
                    }
                    continue;
                }
                if self.partial.is_empty() {
                    let op = data[i];
                    if op == 0xA5 {
                        // A sync marker while synced: consume it.
                        if data.get(i + 1) == Some(&0xA5) {
                            i += 2;
                            continue;
                        }
                    }
                    if !(1..=4).contains(&op) {
                        sink.discontinuity(None, Discontinuity::Error);
                        self.synced = false;
                        self.reported_gap = true;
                        self.half_sync = false;
                        continue;
                    }
                    let n = need(op);
                    if data.len() - i >= n {
                        let mut buf = [0u8; 17];
                        buf[..n].copy_from_slice(&data[i..i + n]);
                        i += n;
                        self.packet(&buf[..n], sink);
                        continue;
                    }
                    self.partial.extend_from_slice(&data[i..]);
                    return;
                }
                let n = need(self.partial[0]);
                let take = (n - self.partial.len()).min(data.len() - i);
                self.partial.extend_from_slice(&data[i..i + take]);
                i += take;
                if self.partial.len() == n {
                    let p = std::mem::take(&mut self.partial);
                    self.packet(&p, sink);
                }
            }
        }

        fn reset(&mut self) {
            *self = ToyDecoder::default();
        }
    }

    /// Factory of [`ToyDecoder`]s.
    #[derive(Debug, Default)]
    pub struct ToyFactory;

    impl DecoderFactory for ToyFactory {
        fn create(&self, _aux_cpu: i32, _cpus: &[CpuTraceConfig], _raw: bool) -> Box<dyn WindowDecoder> {
            Box::new(ToyDecoder::default())
        }
    }
}
