//! Interned symbolized frames: a frame is a function name in a binary.

use std::collections::HashMap;

/// Index of a frame in a [`FrameTable`].
pub type FrameId = u32;

/// The reserved frame standing for contexts folded away by the trie's memory bound.
pub const FRAME_OTHER: FrameId = 0;

/// A symbolized frame: the function and the binary it lives in (`None`: unknown mapping).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Function name (demangled), or a placeholder such as `[unknown]` / `libc.so.6+0x1234`.
    pub function: String,
    /// Index of the binary in the address space (`BinaryId.0`), if known.
    pub binary: Option<u32>,
}

impl Frame {
    /// A frame for `function` in `binary`.
    pub fn new(function: impl Into<String>, binary: Option<u32>) -> Frame {
        Frame { function: function.into(), binary }
    }
}

/// Interning table: one id per distinct [`Frame`]; id 0 is [`FRAME_OTHER`] (`[other]`).
#[derive(Debug, Clone)]
pub struct FrameTable {
    frames: Vec<Frame>,
    index: HashMap<Frame, FrameId>,
}

impl Default for FrameTable {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameTable {
    /// An empty table holding only `[other]`.
    pub fn new() -> FrameTable {
        let mut t = FrameTable { frames: Vec::new(), index: HashMap::new() };
        let other = t.intern(Frame::new("[other]", None));
        debug_assert_eq!(other, FRAME_OTHER);
        t
    }

    /// The id of `frame`, adding it if new.
    pub fn intern(&mut self, frame: Frame) -> FrameId {
        if let Some(&id) = self.index.get(&frame) {
            return id;
        }
        let id = self.frames.len() as FrameId;
        self.frames.push(frame.clone());
        self.index.insert(frame, id);
        id
    }

    /// The frame with id `id` (`[other]` for an out-of-range id).
    pub fn get(&self, id: FrameId) -> &Frame {
        self.frames.get(id as usize).unwrap_or(&self.frames[0])
    }

    /// Number of frames, including `[other]`.
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// Always false: `[other]` is always present.
    pub fn is_empty(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Interning returns the same id for equal frames and distinct ids otherwise.
    #[test]
    fn intern_dedups() {
        let mut t = FrameTable::new();
        let a = t.intern(Frame::new("a", Some(1)));
        let a2 = t.intern(Frame::new("a", Some(1)));
        let b = t.intern(Frame::new("a", Some(2)));
        assert_eq!(a, a2);
        assert_ne!(a, b);
        assert_eq!(t.get(FRAME_OTHER).function, "[other]");
        assert_eq!(t.get(9999).function, "[other]");
    }
}
