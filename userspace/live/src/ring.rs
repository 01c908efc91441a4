//! The view of one mapped perf buffer that the drain works on, and [`MemRing`], the same
//! buffer in plain memory: the kernel side of tests and of the driver model writes records and
//! AUX bytes into it exactly as `kernel/events/ring_buffer.c` lays them out, and the drain
//! under test consumes them through the same [`RingSource`] as a real mmap.

use std::sync::atomic::{AtomicU64, Ordering};

use etm_perf::ring::{UserPage, page};

/// A mapped perf buffer: the user page, the data ring and the AUX ring.
pub trait RingSource {
    /// The metadata page.
    fn page(&self) -> UserPage<'_>;
    /// The data ring bytes (power-of-two length).
    fn data(&self) -> &[u8];
    /// The AUX ring bytes (empty if the event has none).
    fn aux(&self) -> &[u8];
    /// `PERF_EVENT_IOC_ENABLE` on the ring's event (after the kernel disabled it: a full AUX
    /// ring or a TRUNCATED record, `perf_aux_output_begin`/`perf_aux_output_end`).
    fn reenable(&mut self) -> std::io::Result<()>;
}

/// A perf buffer in plain memory. The producer side mirrors the kernel: records are copied
/// at `data_head` with wrap-around and the head is published with release ordering
/// (`perf_output_put_handle`); AUX bytes are written at `aux_head` and published the same way
/// (`perf_aux_output_end`). Free space is what the consumer's tails leave.
pub struct MemRing {
    words: Vec<AtomicU64>,
    data: Vec<u8>,
    aux: Vec<u8>,
    /// `PERF_EVENT_IOC_ENABLE` calls received.
    pub reenables: usize,
    /// Set by [`RingSource::reenable`]; the producer clears it when it acts on it.
    pub reenable_pending: bool,
}

const DATA_HEAD: usize = 1024;
const DATA_TAIL: usize = 1032;
const AUX_HEAD: usize = 1056;
const AUX_TAIL: usize = 1064;

impl MemRing {
    /// A ring of `data_size` data bytes and `aux_size` AUX bytes (powers of two, or 0 AUX).
    pub fn new(data_size: usize, aux_size: usize) -> Self {
        MemRing {
            words: (0..page::WORDS).map(|_| AtomicU64::new(0)).collect(),
            data: vec![0; data_size],
            aux: vec![0; aux_size],
            reenables: 0,
            reenable_pending: false,
        }
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        &self.words[off / 8]
    }

    /// Producer: free data-ring bytes (`perf_output_begin` refuses records that do not fit and
    /// counts them as lost).
    pub fn data_space(&self) -> u64 {
        let used = self.data_head().wrapping_sub(self.data_tail());
        (self.data.len() as u64).saturating_sub(used)
    }

    /// Producer: appends a record at `data_head` if it fits; false if it would overwrite
    /// unread data.
    pub fn push_record(&mut self, rec: &[u8]) -> bool {
        if rec.len() as u64 > self.data_space() {
            return false;
        }
        let head = self.data_head();
        let n = self.data.len() as u64;
        for (i, b) in rec.iter().enumerate() {
            self.data[((head + i as u64) % n) as usize] = *b;
        }
        self.word(DATA_HEAD).store(head + rec.len() as u64, Ordering::Release);
        true
    }

    /// Producer: free AUX bytes (`perf_aux_output_begin`: `CIRC_SPACE(aux_head, aux_tail)`).
    pub fn aux_space(&self) -> u64 {
        let used = self.aux_head().wrapping_sub(self.aux_tail());
        (self.aux.len() as u64).saturating_sub(used)
    }

    /// Producer: writes AUX bytes at `aux_head` and publishes the new head; returns the old
    /// head (the record's `aux_offset`). The caller checks [`MemRing::aux_space`] first, as a
    /// sink driver is handed `handle->size`.
    pub fn push_aux(&mut self, bytes: &[u8]) -> u64 {
        let head = self.write_aux_at(self.aux_head(), bytes);
        self.word(AUX_HEAD).store(head + bytes.len() as u64, Ordering::Release);
        head
    }

    /// Producer: writes AUX bytes at ring position `pos` without publishing them (a TRBE
    /// writes into the AUX pages directly; the head moves only at `perf_aux_output_end`).
    pub fn write_aux_at(&mut self, pos: u64, bytes: &[u8]) -> u64 {
        let n = self.aux.len() as u64;
        for (i, b) in bytes.iter().enumerate() {
            self.aux[((pos + i as u64) % n) as usize] = *b;
        }
        pos
    }

    /// Producer: moves `aux_head` to `head` (bytes before it are published).
    pub fn set_aux_head(&mut self, head: u64) {
        self.word(AUX_HEAD).store(head, Ordering::Release);
    }

    pub fn data_head(&self) -> u64 {
        self.word(DATA_HEAD).load(Ordering::Acquire)
    }
    pub fn data_tail(&self) -> u64 {
        self.word(DATA_TAIL).load(Ordering::Acquire)
    }
    pub fn aux_head(&self) -> u64 {
        self.word(AUX_HEAD).load(Ordering::Acquire)
    }
    pub fn aux_tail(&self) -> u64 {
        self.word(AUX_TAIL).load(Ordering::Acquire)
    }
}

impl RingSource for MemRing {
    fn page(&self) -> UserPage<'_> {
        UserPage::new(&self.words).expect("page::WORDS words")
    }
    fn data(&self) -> &[u8] {
        &self.data
    }
    fn aux(&self) -> &[u8] {
        &self.aux
    }
    fn reenable(&mut self) -> std::io::Result<()> {
        self.reenables += 1;
        self.reenable_pending = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The producer never overwrites what the consumer has not released: a record or AUX
    /// write that does not fit is refused and the space reappears when the tails move.
    #[test]
    fn producer_respects_tails() {
        let mut r = MemRing::new(64, 32);
        assert!(r.push_record(&[1; 40]));
        assert!(!r.push_record(&[2; 40]));
        r.page().set_data_tail(40);
        assert!(r.push_record(&[2; 40]));
        assert_eq!(r.data()[..16], [2; 16], "the second record wraps to the start");
        assert_eq!(r.aux_space(), 32);
        r.push_aux(&[7; 20]);
        assert_eq!(r.aux_space(), 12);
        r.page().set_aux_tail(20);
        assert_eq!(r.aux_space(), 32);
    }
}
