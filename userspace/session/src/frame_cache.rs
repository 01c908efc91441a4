//! The context trie's frames of each stack address, cached: a function and the callees inlined
//! at the address (outermost first) are named once per address, not once per sample.

use std::collections::HashMap;

use etm_stacks::FrameId;

/// Addresses kept at most (beyond: named again every time).
const MAX_ADDRS: usize = 1 << 20;
/// Frames kept at most over all addresses (inline chains are short: a few per address).
const MAX_FRAMES: usize = 1 << 22;

/// Runtime address -> its frames, bounded by [`MAX_ADDRS`] and [`MAX_FRAMES`].
#[derive(Debug, Default)]
pub(crate) struct FrameCache {
    /// Address -> (first, count) in `frames`.
    spans: HashMap<u64, (u32, u32)>,
    frames: Vec<FrameId>,
}

impl FrameCache {
    /// The frames of `addr`, if cached.
    #[inline]
    pub(crate) fn get(&self, addr: u64) -> Option<&[FrameId]> {
        self.spans.get(&addr).map(|&(at, n)| &self.frames[at as usize..(at + n) as usize])
    }

    /// Keeps the frames of `addr`, unless the cache is full.
    pub(crate) fn insert(&mut self, addr: u64, frames: &[FrameId]) {
        if frames.is_empty() || self.spans.len() >= MAX_ADDRS || self.frames.len() + frames.len() > MAX_FRAMES {
            return;
        }
        let at = self.frames.len() as u32;
        self.frames.extend_from_slice(frames);
        self.spans.insert(addr, (at, frames.len() as u32));
    }

    /// Forgets every address.
    pub(crate) fn clear(&mut self) {
        self.spans.clear();
        self.frames.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chains of one and several frames come back as kept; the bound on addresses holds and a
    /// clear forgets.
    #[test]
    fn spans_round_trip() {
        let mut c = FrameCache::default();
        let (a, b, d): (FrameId, FrameId, FrameId) = (1, 2, 3);
        c.insert(0x10, &[a]);
        c.insert(0x20, &[a, b, d]);
        c.insert(0x30, &[]);
        assert_eq!(c.get(0x10), Some(&[a][..]));
        assert_eq!(c.get(0x20), Some(&[a, b, d][..]));
        assert_eq!(c.get(0x30), None);
        for i in 0..MAX_ADDRS as u64 + 10 {
            c.insert(0x1000 + i, &[b]);
        }
        assert_eq!(c.spans.len(), MAX_ADDRS);
        assert_eq!(c.get(0x20), Some(&[a, b, d][..]));
        c.clear();
        assert_eq!(c.get(0x10), None);
    }
}
