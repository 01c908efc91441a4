//! Code memory for the instruction walker: a [`MemoryAccess`] trait (read code bytes at an
//! address in a memory space) and [`MemoryImage`], an in-memory implementation over regions
//! (e.g. the memory dumps of an OpenCSD snapshot, or ELF text segments). The decoder never
//! does I/O itself.
//!
//! Memory spaces follow OpenCSD's `ocsd_mem_space_acc_t` bit set: the trace context (exception
//! level and security state from the ETMv4/ETE context packet, IHI 0064 section 6.4.6 / DDI 0608
//! "Context packet") selects which regions may supply the code.

/// A set of memory spaces (bit set, OpenCSD `ocsd_mem_space_acc_t` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MemSpace(pub u8);

impl MemSpace {
    /// No space.
    pub const NONE: MemSpace = MemSpace(0);
    /// EL0/EL1 secure.
    pub const EL1S: MemSpace = MemSpace(0x01);
    /// EL0/EL1 non-secure.
    pub const EL1N: MemSpace = MemSpace(0x02);
    /// EL2 non-secure.
    pub const EL2: MemSpace = MemSpace(0x04);
    /// EL3.
    pub const EL3: MemSpace = MemSpace(0x08);
    /// EL2 secure.
    pub const EL2S: MemSpace = MemSpace(0x10);
    /// EL0/EL1 realm.
    pub const EL1R: MemSpace = MemSpace(0x20);
    /// EL2 realm.
    pub const EL2R: MemSpace = MemSpace(0x40);
    /// Root.
    pub const ROOT: MemSpace = MemSpace(0x80);
    /// Any secure.
    pub const S: MemSpace = MemSpace(0x19);
    /// Any non-secure.
    pub const N: MemSpace = MemSpace(0x06);
    /// Any realm.
    pub const R: MemSpace = MemSpace(0x60);
    /// Any space.
    pub const ANY: MemSpace = MemSpace(0xFF);

    /// True if the two sets share a space.
    #[inline]
    pub fn overlaps(self, o: MemSpace) -> bool {
        self.0 & o.0 != 0
    }

    /// Parses a snapshot `space=` value (case-insensitive; absent means any).
    pub fn from_snapshot(s: Option<&str>) -> MemSpace {
        let Some(s) = s else { return MemSpace::ANY };
        match s.trim().to_ascii_uppercase().as_str() {
            "EL1S" => MemSpace::EL1S,
            "EL1N" => MemSpace::EL1N,
            "EL2" | "EL2N" => MemSpace::EL2,
            "EL3" => MemSpace::EL3,
            "EL2S" => MemSpace::EL2S,
            "EL1R" => MemSpace::EL1R,
            "EL2R" => MemSpace::EL2R,
            "ROOT" => MemSpace::ROOT,
            "S" => MemSpace::S,
            "N" | "NS" => MemSpace::N,
            "R" => MemSpace::R,
            _ => MemSpace::ANY,
        }
    }

    /// OpenCSD's name for the space, as printed in `ADDR_NACC` elements.
    pub fn name(self) -> String {
        let fixed = match self.0 {
            0x00 => "None",
            0x01 => "EL1S",
            0x02 => "EL1N",
            0x04 => "EL2N",
            0x08 => "EL3",
            0x10 => "EL2S",
            0x20 => "EL1R",
            0x40 => "EL2R",
            0x80 => "Root",
            0x19 => "Any S",
            0x06 => "Any NS",
            0x60 => "Any R",
            0xFF => "Any",
            _ => "",
        };
        if !fixed.is_empty() {
            return fixed.to_string();
        }
        let names = ["EL1S", "EL1N", "EL2N", "EL3", "EL2S", "EL1R", "EL2R", "Root"];
        let parts: Vec<&str> = (0..8).filter(|b| self.0 & (1 << b) != 0).map(|b| names[b]).collect();
        parts.join(",")
    }
}

/// Read access to the traced program's code.
pub trait MemoryAccess {
    /// Copies up to `buf.len()` bytes at `addr` in `space` into `buf`; returns the number of
    /// bytes available contiguously from `addr` (0 if `addr` is not mapped).
    fn read(&self, addr: u64, space: MemSpace, buf: &mut [u8]) -> usize;

    /// The contiguous bytes starting at `addr`, if the implementation holds them in memory.
    /// The walker uses this to avoid a lookup per instruction.
    fn slice_at(&self, _addr: u64, _space: MemSpace) -> Option<&[u8]> {
        None
    }

    /// [`MemoryAccess::read`] for the code of the context the trace is in: `context_id` is the
    /// CONTEXTIDR value the trace last reported (`None`: not traced). The decoder reads
    /// through these; an image with one address space ignores the context (the default).
    /// (OpenCSD passes the trace ID with every read for the same purpose,
    /// `TrcMemAccessorBase::readBytes`.)
    fn read_ctx(&self, addr: u64, space: MemSpace, _context_id: Option<u32>, buf: &mut [u8]) -> usize {
        self.read(addr, space, buf)
    }

    /// [`MemoryAccess::slice_at`] for the code of `context_id` (see [`MemoryAccess::read_ctx`]).
    fn slice_at_ctx(&self, addr: u64, space: MemSpace, _context_id: Option<u32>) -> Option<&[u8]> {
        self.slice_at(addr, space)
    }

    /// An id of the code `context_id` sees: contexts with the same id read the same bytes, so
    /// the decoders share their decoded blocks (the threads of one process). Default: the
    /// context ID itself (every context its own code).
    fn code_id(&self, _space: MemSpace, context_id: Option<u32>) -> u64 {
        u64::from(context_id.unwrap_or(0))
    }

    /// False when `context_id` sees no code at all (every read fails: another process's
    /// context, say), so the decoder need not walk: each walk there would end at its first
    /// instruction with the address not accessible. Default: true.
    fn has_code(&self, _space: MemSpace, _context_id: Option<u32>) -> bool {
        true
    }

    /// Changes whenever [`code_id`](MemoryAccess::code_id) or the bytes behind it may have
    /// changed (decoders then recompute their cache tags). Default: never.
    fn generation(&self) -> u64 {
        0
    }
}

/// One mapped region of code.
#[derive(Debug, Clone)]
pub struct Region {
    /// First address.
    pub start: u64,
    /// Contents.
    pub data: Vec<u8>,
    /// Spaces the region is visible in.
    pub space: MemSpace,
}

impl Region {
    #[inline]
    fn end(&self) -> u64 {
        self.start.saturating_add(self.data.len() as u64)
    }
}

/// In-memory code image: a list of regions searched in insertion order (first match wins,
/// like OpenCSD's memory accessor map).
#[derive(Debug, Default, Clone)]
pub struct MemoryImage {
    regions: Vec<Region>,
    last: std::cell::Cell<usize>,
}

impl MemoryImage {
    /// Empty image.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a region.
    pub fn add(&mut self, start: u64, data: Vec<u8>, space: MemSpace) {
        if !data.is_empty() {
            self.regions.push(Region { start, data, space });
        }
    }

    /// The regions.
    pub fn regions(&self) -> &[Region] {
        &self.regions
    }

    #[inline]
    fn find(&self, addr: u64, space: MemSpace) -> Option<&Region> {
        let last = self.last.get();
        if let Some(r) = self.regions.get(last)
            && addr >= r.start
            && addr < r.end()
            && r.space.overlaps(space)
            && !self.shadowed(last, addr, space)
        {
            return Some(r);
        }
        for (i, r) in self.regions.iter().enumerate() {
            if addr >= r.start && addr < r.end() && r.space.overlaps(space) {
                self.last.set(i);
                return Some(r);
            }
        }
        None
    }

    /// True if an earlier region also covers `addr` (then it wins over `idx`).
    #[inline]
    fn shadowed(&self, idx: usize, addr: u64, space: MemSpace) -> bool {
        self.regions[..idx].iter().any(|r| addr >= r.start && addr < r.end() && r.space.overlaps(space))
    }
}

impl MemoryAccess for MemoryImage {
    fn read(&self, addr: u64, space: MemSpace, buf: &mut [u8]) -> usize {
        match self.find(addr, space) {
            Some(r) => {
                let off = (addr - r.start) as usize;
                let n = buf.len().min(r.data.len() - off);
                buf[..n].copy_from_slice(&r.data[off..off + n]);
                n
            }
            None => 0,
        }
    }

    fn slice_at(&self, addr: u64, space: MemSpace) -> Option<&[u8]> {
        let r = self.find(addr, space)?;
        Some(&r.data[(addr - r.start) as usize..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads stop at the end of a region and respect memory spaces.
    #[test]
    fn region_reads() {
        let mut m = MemoryImage::new();
        m.add(0x1000, vec![1, 2, 3, 4, 5, 6], MemSpace::EL1N);
        let mut b = [0u8; 4];
        assert_eq!(m.read(0x1004, MemSpace::EL1N, &mut b), 2);
        assert_eq!(&b[..2], &[5, 6]);
        assert_eq!(m.read(0x1000, MemSpace::EL3, &mut b), 0);
        assert_eq!(m.read(0x0FFF, MemSpace::ANY, &mut b), 0);
        assert_eq!(m.slice_at(0x1002, MemSpace::N).unwrap(), &[3, 4, 5, 6]);
    }

    /// Space names match OpenCSD's printing.
    #[test]
    fn space_names() {
        assert_eq!(MemSpace::EL1N.name(), "EL1N");
        assert_eq!(MemSpace::EL2.name(), "EL2N");
        assert_eq!(MemSpace::from_snapshot(Some("root")), MemSpace::ROOT);
    }
}
