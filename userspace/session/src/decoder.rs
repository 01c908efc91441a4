//! Trace decoders behind [`WindowDecoder`]: the `etm_decode` adapter (the real one) and
//! [`toy::ToyDecoder`], a test double with a trivial byte format used to test the pipeline's
//! fault handling independently of the ETM decoder.

use std::sync::Arc;

use crate::pipeline::DecoderFactory;
#[cfg(doc)]
use crate::pipeline::WindowDecoder;

/// The default decoder factory (`etm_decode`), if this build has one.
pub fn default_factory() -> Option<Arc<dyn DecoderFactory>> {
    None
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
