//! The CoreSight trace formatter (IHI 0029, "Trace Formatter"; the frame layout as
//! `../shared/docs/etm-interface.md` §3.2 gives it from OpenCSD's `unpackFrame`): what an ETR
//! (or ETF) writes when several trace sources share it through a funnel.
//!
//! A frame is 16 bytes. Bytes 0..=14 carry data or ID changes in byte pairs; byte 15 holds the
//! auxiliary bits, bit k for pair k (bytes 2k, 2k+1; bit 7 for byte 14):
//!
//! * an even byte with bit 0 set is an **ID change** to `byte >> 1`; its auxiliary bit says
//!   whether the odd byte after it still belongs to the *old* ID (1) or already to the new
//!   one (0);
//! * an even byte with bit 0 clear is a **data byte** whose bit 0 is the auxiliary bit;
//! * odd bytes are always data (8 bits);
//! * byte 14 is either an ID change (no data) or a data byte (bit 0 in auxiliary bit 7).
//!
//! ID 0 is the null source: a flush pads the last frame with it, and decoders drop its data.

/// A stateful frame writer: [`Formatter::push`] bytes of a trace ID in production order,
/// [`Formatter::take_frames`] the complete frames.
#[derive(Debug, Clone, Default)]
pub struct Formatter {
    /// Bytes not yet in a frame, with their IDs.
    queue: std::collections::VecDeque<(u8, u8)>,
    /// The ID the last frame ended in.
    cur: u8,
    frames: Vec<u8>,
}

impl Formatter {
    /// A formatter whose current ID is the null ID.
    pub fn new() -> Self {
        Formatter::default()
    }

    /// Queues `data` of source `id` (1..=0x6F).
    pub fn push(&mut self, id: u8, data: &[u8]) {
        self.queue.extend(data.iter().map(|&b| (id, b)));
        while self.queue.len() >= 16 {
            self.frame();
        }
    }

    /// Writes what is queued into frames, the last one padded with the null ID (what a flush
    /// of the formatter does, `tmc_flush_and_stop`).
    pub fn flush(&mut self) {
        while !self.queue.is_empty() {
            self.frame();
        }
    }

    /// The complete frames written so far (removed from the formatter).
    pub fn take_frames(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.frames)
    }

    /// Bytes queued but not yet in a frame.
    pub fn pending(&self) -> usize {
        self.queue.len()
    }

    /// Forgets everything (the sink was re-enabled: a new session of frames).
    pub fn reset(&mut self) {
        *self = Formatter::default();
    }

    /// One frame from the front of the queue (padding with ID 0 when it runs dry).
    fn frame(&mut self) {
        let mut f = [0u8; 16];
        let mut aux = 0u8;
        for k in 0..7 {
            let (even, odd) = (2 * k, 2 * k + 1);
            match self.queue.front().copied() {
                Some((id, b)) if id == self.cur => {
                    // Data in the even slot, bit 0 in the auxiliary bit.
                    self.queue.pop_front();
                    f[even] = b & 0xFE;
                    aux |= (b & 1) << k;
                    f[odd] = self.next_data_or_switch(&mut f, even, &mut aux, k);
                }
                Some((id, _)) => {
                    // ID change; the odd byte is the new ID's (auxiliary bit 0).
                    f[even] = (id << 1) | 1;
                    self.cur = id;
                    f[odd] = self.next_data_or_switch(&mut f, even, &mut aux, k);
                }
                None => {
                    // Pad: switch to the null ID; its data is dropped.
                    if self.cur != 0 {
                        f[even] = 1;
                        self.cur = 0;
                    } else {
                        f[even] = 0;
                    }
                    f[odd] = 0;
                }
            }
        }
        // Byte 14: data of the current ID, or an ID change (no data).
        match self.queue.front().copied() {
            Some((id, b)) if id == self.cur => {
                self.queue.pop_front();
                f[14] = b & 0xFE;
                aux |= (b & 1) << 7;
            }
            Some((id, _)) => {
                f[14] = (id << 1) | 1;
                self.cur = id;
            }
            None if self.cur != 0 => {
                f[14] = 1;
                self.cur = 0;
            }
            None => f[14] = 0,
        }
        f[15] = aux;
        self.frames.extend_from_slice(&f);
    }

    /// The odd byte after slot `even`: the next byte if it is the current ID's; if the next
    /// byte is another ID's and the even slot holds a data byte, that slot becomes the ID
    /// change with auxiliary bit 1 ("the odd byte is still the old ID's") and its data moves
    /// to the odd slot; with nothing left, the null ID.
    fn next_data_or_switch(&mut self, f: &mut [u8; 16], even: usize, aux: &mut u8, k: usize) -> u8 {
        match self.queue.front().copied() {
            Some((id, b)) if id == self.cur => {
                self.queue.pop_front();
                b
            }
            next => {
                // Only reached after a data byte in the even slot: an ID byte there switched to
                // the front byte's ID, which the arm above then takes.
                debug_assert_eq!(f[even] & 1, 0);
                // Move the even slot's data byte to the odd slot and switch first.
                let data = f[even] | ((*aux >> k) & 1);
                *aux |= 1 << k;
                let new = next.map_or(0, |(id, _)| id);
                f[even] = (new << 1) | 1;
                self.cur = new;
                data
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etm_decode::frame::{Deformatter, FrameSink, StreamFormat};

    struct Collect(Vec<(u8, u8)>);
    impl FrameSink for Collect {
        fn data(&mut self, id: u8, _index: u64, bytes: &[u8]) {
            self.0.extend(bytes.iter().map(|&b| (id, b)));
        }
        fn reset(&mut self) {}
    }

    fn deformat(frames: &[u8]) -> Vec<(u8, u8)> {
        let mut d = Deformatter::new(StreamFormat::Coresight);
        let mut c = Collect(Vec::new());
        d.push(frames, &mut c);
        c.0.into_iter().filter(|&(id, _)| id != 0).collect()
    }

    fn lcg(x: &mut u64) -> u64 {
        *x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *x >> 33
    }

    /// Interleaved sources with runs of every length, odd and even bytes, through our
    /// deformatter (itself OpenCSD-exact on real formatted captures): every byte comes back
    /// under its ID, in order.
    #[test]
    fn interleaved_sources_round_trip() {
        for seed in 1..40u64 {
            let mut x = seed;
            let mut f = Formatter::new();
            let mut want = Vec::new();
            for _ in 0..60 {
                let id = [0x10u8, 0x12, 0x14, 0x16][(lcg(&mut x) % 4) as usize];
                let n = (lcg(&mut x) % 9) as usize;
                let bytes: Vec<u8> = (0..n).map(|_| lcg(&mut x) as u8).collect();
                want.extend(bytes.iter().map(|&b| (id, b)));
                f.push(id, &bytes);
            }
            f.flush();
            let frames = f.take_frames();
            assert_eq!(frames.len() % 16, 0);
            assert_eq!(deformat(&frames), want, "seed {seed}");
        }
    }

    /// One source: one ID change, then data (the simple layout ETR captures show).
    #[test]
    fn single_source_layout() {
        let mut f = Formatter::new();
        f.push(0x10, &(1..=20u8).collect::<Vec<_>>());
        f.flush();
        let fr = f.take_frames();
        assert_eq!(fr[0], (0x10 << 1) | 1);
        assert_eq!(deformat(&fr), (1..=20u8).map(|b| (0x10, b)).collect::<Vec<_>>());
    }
}
