//! The context trie's frames of each stack address, cached: a function and the callees inlined
//! at the address (outermost first) are named once per address, not once per sample; and the
//! trie node of each whole stack, so a stack seen before is one lookup, not one per frame.

use std::collections::HashMap;

use etm_stacks::FrameId;
use etm_stacks::trie::NodeId;

/// Addresses kept at most (beyond: named again every time).
const MAX_ADDRS: usize = 1 << 20;
/// Frames kept at most over all addresses (inline chains are short: a few per address).
const MAX_FRAMES: usize = 1 << 22;

/// Return addresses of a stack kept in [`FrameCache::stack_node`]'s slots at most (deeper
/// stacks are named frame by frame).
const STACK_MAX: usize = 32;
/// Slots of the stack cache (direct-mapped).
const STACK_SLOTS: usize = 1024;

/// A stack and its trie node: (process, stack cut by the callers check, its length), the
/// trie's compaction count the node belongs to, the node and the stack's words.
#[derive(Debug, Clone, Copy)]
struct StackSlot {
    pid: u32,
    cut: bool,
    len: u8,
    epoch: u64,
    node: NodeId,
    words: [u64; STACK_MAX],
}

const EMPTY_SLOT: StackSlot = StackSlot { pid: 0, cut: false, len: 0, epoch: u64::MAX, node: 0, words: [0; STACK_MAX] };

/// Runtime address -> its frames, bounded by [`MAX_ADDRS`] and [`MAX_FRAMES`]; and whole
/// stacks -> their trie node ([`STACK_SLOTS`] of at most [`STACK_MAX`] addresses).
#[derive(Debug, Default)]
pub(crate) struct FrameCache {
    /// Address -> (first, count) in `frames`.
    spans: HashMap<u64, (u32, u32), std::hash::BuildHasherDefault<etm_profile::exact::IntHasher>>,
    frames: Vec<FrameId>,
    stacks: Vec<StackSlot>,
}

/// The stack cache's slot of a stack.
fn stack_slot(pid: u32, cut: bool, stack: &[u64]) -> usize {
    let mut h = u64::from(pid) << 1 | u64::from(cut);
    for &w in stack {
        h = (h.rotate_left(23) ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    (h >> (64 - STACK_SLOTS.trailing_zeros())) as usize
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

    /// The trie node of `stack` (of process `pid`, `cut` by the callers check) kept by
    /// [`keep_stack`](Self::keep_stack) while the trie's ids are those of compaction `epoch`.
    #[inline]
    pub(crate) fn stack_node(&self, pid: u32, cut: bool, stack: &[u64], epoch: u64) -> Option<NodeId> {
        if stack.len() > STACK_MAX || self.stacks.is_empty() {
            return None;
        }
        let s = &self.stacks[stack_slot(pid, cut, stack)];
        (s.epoch == epoch && s.pid == pid && s.cut == cut && s.words[..usize::from(s.len)] == *stack).then_some(s.node)
    }

    /// Keeps `node` as the trie node of `stack` (see [`stack_node`](Self::stack_node)): every
    /// frame of the stack was named from a resolved address, and the node is the whole path.
    pub(crate) fn keep_stack(&mut self, pid: u32, cut: bool, stack: &[u64], epoch: u64, node: NodeId) {
        if stack.len() > STACK_MAX {
            return;
        }
        if self.stacks.is_empty() {
            self.stacks = vec![EMPTY_SLOT; STACK_SLOTS];
        }
        let s = &mut self.stacks[stack_slot(pid, cut, stack)];
        *s = StackSlot { pid, cut, len: stack.len() as u8, epoch, node, words: [0; STACK_MAX] };
        s.words[..stack.len()].copy_from_slice(stack);
    }

    /// Forgets every address and stack.
    pub(crate) fn clear(&mut self) {
        self.spans.clear();
        self.frames.clear();
        self.stacks.clear();
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
