//! Calling-context trie with self/total counts and an explicit memory bound.
//!
//! Paths are added outermost caller first. Node 0 is the root (no frame). Each node knows its
//! parent, frame, self count (samples whose leaf context is this node) and total count
//! (samples whose context passes through it).
//!
//! Memory bound: at most `max_nodes` regular nodes plus a spare budget of `max_nodes / 16`
//! `[other]` nodes. When a new context needs a node beyond `max_nodes`, the trie first folds
//! its cold half: every context whose total is at most the median total is removed and its
//! samples are added to an `[other]` child of its nearest kept caller ([`ContextTrie::fold_cold`];
//! totals only shrink along a path, so the kept contexts stay connected). If that frees too
//! little, the rest of the new path is folded into the `[other]` child of the deepest existing
//! node (from the spare budget) or, once that is used up, into that node itself. Every folded
//! sample is counted in [`TrieStats::folded_samples`], and totals stay consistent (a node's
//! total is its self count plus its children's totals). Node ids change when cold contexts
//! are folded ([`TrieStats::compactions`] counts it).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::frames::{FRAME_OTHER, FrameId};

/// Multiplicative hasher for the `(node, frame)` child keys (two `u32`s): SipHash was ~60% of
/// the instructions of `add` under callgrind. Keys come from our own ids, not from an
/// adversary, so HashDoS resistance is not needed.
#[derive(Default, Clone, Copy)]
struct PairHasher(u64);

impl Hasher for PairHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(26) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn finish(&self) -> u64 {
        // Fold the high bits down: hashbrown takes its control bits from the top, buckets from
        // the bottom.
        self.0 ^ (self.0 >> 29)
    }
}

type ChildMap = HashMap<(NodeId, FrameId), NodeId, BuildHasherDefault<PairHasher>>;

/// Index of a node in a [`ContextTrie`].
pub type NodeId = u32;
/// The root node.
pub const ROOT: NodeId = 0;
const NONE: NodeId = u32::MAX;

/// One calling context.
#[derive(Debug, Clone, Copy)]
pub struct Node {
    /// Parent node (the root's parent is itself).
    pub parent: NodeId,
    /// Frame of this context's innermost function (`FRAME_OTHER` for the root).
    pub frame: FrameId,
    /// Samples whose whole context ends here.
    pub self_count: u64,
    /// Samples whose context passes through here (self + descendants).
    pub total_count: u64,
    /// Depth (root = 0).
    pub depth: u32,
    first_child: NodeId,
    next_sibling: NodeId,
}

/// Counters of the trie.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrieStats {
    /// Samples added (sum of counts).
    pub samples: u64,
    /// Samples whose context was cut short by the memory bound.
    pub folded_samples: u64,
    /// Nodes in use, including the root.
    pub nodes: usize,
    /// Times the cold contexts were folded (node ids changed).
    pub compactions: u64,
}

/// A calling-context trie (see the module docs for the memory bound).
#[derive(Debug, Clone)]
pub struct ContextTrie {
    nodes: Vec<Node>,
    children: ChildMap,
    max_nodes: usize,
    spare: usize,
    folded_samples: u64,
    compactions: u64,
    /// Adds to wait before the next automatic fold after one that freed little.
    cooldown: u64,
}

impl ContextTrie {
    /// An empty trie holding at most `max_nodes` regular nodes (at least 2).
    pub fn new(max_nodes: usize) -> ContextTrie {
        let max_nodes = max_nodes.max(2);
        let root = Node {
            parent: ROOT,
            frame: FRAME_OTHER,
            self_count: 0,
            total_count: 0,
            depth: 0,
            first_child: NONE,
            next_sibling: NONE,
        };
        ContextTrie {
            nodes: vec![root],
            children: ChildMap::default(),
            max_nodes,
            spare: max_nodes / 16,
            folded_samples: 0,
            compactions: 0,
            cooldown: 0,
        }
    }

    /// Upper bound on the number of nodes this trie will ever hold.
    pub fn node_limit(&self) -> usize {
        self.max_nodes + self.max_nodes / 16
    }

    fn new_child(&mut self, parent: NodeId, frame: FrameId) -> NodeId {
        let id = self.nodes.len() as NodeId;
        let p = &mut self.nodes[parent as usize];
        let depth = p.depth + 1;
        let next_sibling = p.first_child;
        p.first_child = id;
        self.nodes.push(Node { parent, frame, self_count: 0, total_count: 0, depth, first_child: NONE, next_sibling });
        self.children.insert((parent, frame), id);
        id
    }

    /// Adds `count` samples of the context `path` (outermost caller first, leaf last).
    /// Returns the node the samples were attributed to.
    pub fn add(&mut self, path: &[FrameId], count: u64) -> NodeId {
        self.cooldown = self.cooldown.saturating_sub(1);
        if self.cooldown == 0 && self.nodes.len() >= self.max_nodes && self.needs_new_node(path) {
            // A fold that frees under a quarter of the nodes is not worth repeating soon (it
            // is O(nodes)): fold new contexts into [other] for the next max_nodes adds.
            if self.fold_cold() < self.max_nodes / 4 {
                self.cooldown = self.max_nodes as u64;
            }
        }
        let mut node = ROOT;
        self.nodes[ROOT as usize].total_count += count;
        for &frame in path {
            let next = match self.children.get(&(node, frame)) {
                Some(&n) => n,
                None if self.nodes.len() < self.max_nodes => self.new_child(node, frame),
                None => {
                    self.folded_samples += count;
                    match self.children.get(&(node, FRAME_OTHER)) {
                        Some(&n) => n,
                        None if self.spare > 0 => {
                            self.spare -= 1;
                            self.new_child(node, FRAME_OTHER)
                        }
                        None => break,
                    }
                }
            };
            node = next;
            self.nodes[node as usize].total_count += count;
            if self.nodes[node as usize].frame == FRAME_OTHER && frame != FRAME_OTHER {
                break;
            }
        }
        self.nodes[node as usize].self_count += count;
        node
    }

    /// Adds `count` samples to the context of `node` (one [`add`](Self::add) returned, its
    /// path whole: `node(node).depth` frames): what `add` of that path does, without looking
    /// the path up again. The node must be one of this trie's as it is now (ids change when
    /// cold contexts are folded: [`compactions`](Self::compactions)).
    pub fn add_at(&mut self, node: NodeId, count: u64) {
        self.cooldown = self.cooldown.saturating_sub(1);
        self.nodes[node as usize].self_count += count;
        let mut n = node;
        loop {
            self.nodes[n as usize].total_count += count;
            if n == ROOT {
                break;
            }
            n = self.nodes[n as usize].parent;
        }
    }

    /// How many times cold contexts were folded (node ids changed) so far.
    pub fn compactions(&self) -> u64 {
        self.compactions
    }

    fn needs_new_node(&self, path: &[FrameId]) -> bool {
        let mut node = ROOT;
        for &frame in path {
            match self.children.get(&(node, frame)) {
                Some(&n) => node = n,
                None => return true,
            }
        }
        false
    }

    /// Folds the cold half of the contexts: every context whose total is at most the median
    /// total is removed, its samples moving to an `[other]` child of its nearest kept caller.
    /// Returns the number of nodes freed. Node ids change.
    pub fn fold_cold(&mut self) -> usize {
        let mut totals: Vec<u64> = self.nodes[1..].iter().map(|n| n.total_count).collect();
        if totals.is_empty() {
            return 0;
        }
        let mid = totals.len() / 2;
        let threshold = *totals.select_nth_unstable(mid).1;
        let before = self.nodes.len();
        let old = std::mem::take(&mut self.nodes);
        self.children.clear();
        self.nodes.push(Node { first_child: NONE, next_sibling: NONE, ..old[0] });
        // Parents precede children in `old`, so one pass in index order rebuilds the tree.
        let mut map = vec![NONE; old.len()];
        map[0] = ROOT;
        let mut spare_used = 0;
        for (i, n) in old.iter().enumerate().skip(1) {
            let parent = map[n.parent as usize];
            if parent == NONE {
                continue; // inside a folded subtree: already counted at its top
            }
            if n.total_count > threshold || n.frame == FRAME_OTHER {
                let id = match self.children.get(&(parent, n.frame)) {
                    Some(&id) => id, // an [other] created by folding a sibling
                    None => self.new_child(parent, n.frame),
                };
                let m = &mut self.nodes[id as usize];
                m.self_count += n.self_count;
                m.total_count += n.total_count;
                if n.frame == FRAME_OTHER {
                    spare_used += 1;
                }
                map[i] = id;
            } else {
                let other = match self.children.get(&(parent, FRAME_OTHER)) {
                    Some(&id) => id,
                    None => {
                        spare_used += 1;
                        self.new_child(parent, FRAME_OTHER)
                    }
                };
                let m = &mut self.nodes[other as usize];
                m.self_count += n.total_count;
                m.total_count += n.total_count;
                self.folded_samples += n.total_count;
            }
        }
        self.spare = (self.max_nodes / 16).saturating_sub(spare_used);
        self.compactions += 1;
        before.saturating_sub(self.nodes.len())
    }

    /// The node `id` (the root for an out-of-range id).
    pub fn node(&self, id: NodeId) -> &Node {
        self.nodes.get(id as usize).unwrap_or(&self.nodes[0])
    }

    /// Number of nodes including the root.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True if no sample was added.
    pub fn is_empty(&self) -> bool {
        self.nodes[0].total_count == 0
    }

    /// Total samples added.
    pub fn total_samples(&self) -> u64 {
        self.nodes[0].total_count
    }

    /// Counters.
    pub fn stats(&self) -> TrieStats {
        TrieStats {
            samples: self.total_samples(),
            folded_samples: self.folded_samples,
            nodes: self.nodes.len(),
            compactions: self.compactions,
        }
    }

    /// Children of `id`, most recently created first.
    pub fn children(&self, id: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        let mut next = self.node(id).first_child;
        std::iter::from_fn(move || {
            if next == NONE {
                return None;
            }
            let cur = next;
            next = self.nodes[cur as usize].next_sibling;
            Some(cur)
        })
    }

    /// Ids of all non-root nodes.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> {
        1..self.nodes.len() as NodeId
    }

    /// The frames from the outermost caller to `id` (inclusive) into `out` (cleared first).
    pub fn path_into(&self, id: NodeId, out: &mut Vec<FrameId>) {
        out.clear();
        let mut n = id;
        while n != ROOT && (n as usize) < self.nodes.len() {
            out.push(self.nodes[n as usize].frame);
            n = self.nodes[n as usize].parent;
        }
        out.reverse();
    }

    /// Like [`Self::path_into`], returning a new vector.
    pub fn path(&self, id: NodeId) -> Vec<FrameId> {
        let mut v = Vec::new();
        self.path_into(id, &mut v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_consistent(t: &ContextTrie) {
        for id in std::iter::once(ROOT).chain(t.node_ids()) {
            let kids: u64 = t.children(id).map(|c| t.node(c).total_count).sum();
            assert_eq!(t.node(id).total_count, t.node(id).self_count + kids, "node {id}");
        }
    }

    /// Adding at a node `add` returned counts as adding its path again: two tries fed the
    /// same random paths, one by `add` only and one by `add_at` wherever the path is whole and
    /// the ids still valid, through folds, end up equal node for node.
    #[test]
    fn add_at_is_add_of_the_path() {
        let (mut a, mut b) = (ContextTrie::new(90), ContextTrie::new(90));
        let mut known: HashMap<Vec<FrameId>, (NodeId, u64)> = HashMap::new();
        let mut x: u64 = 7;
        let (mut fast, mut folds) = (0, 0);
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = 1 + (x % 4) as usize;
            // (skewed: frame 1 most often, so some contexts stay hot through the folds)
            let path: Vec<FrameId> = (0..len).map(|i| 1 + ((x >> (8 * i + 5)) % 8).saturating_sub(5) as FrameId).collect();
            a.add(&path, 1);
            match known.get(&path) {
                Some(&(node, epoch)) if epoch == b.compactions() => {
                    b.add_at(node, 1);
                    fast += 1;
                }
                _ => {
                    let node = b.add(&path, 1);
                    if b.node(node).depth as usize == path.len() {
                        known.insert(path, (node, b.compactions()));
                    }
                }
            }
            folds = b.compactions();
            assert_eq!(a.cooldown, b.cooldown);
        }
        assert!(fast > 10_000 && folds > 0, "{fast} by add_at, {folds} folds");
        assert_eq!(a.len(), b.len());
        for id in std::iter::once(ROOT).chain(a.node_ids()) {
            let (p, q) = (a.node(id), b.node(id));
            assert_eq!(
                (p.parent, p.frame, p.self_count, p.total_count),
                (q.parent, q.frame, q.self_count, q.total_count),
                "{id}"
            );
        }
        check_consistent(&b);
        // An add at a node counts toward the fold cooldown as `add` does.
        b.cooldown = 5;
        let n = b.add(&[1], 1);
        b.add_at(n, 1);
        assert_eq!(b.cooldown, 3);
    }

    /// Shared prefixes share nodes; self and total counts follow the definitions.
    #[test]
    fn counts_self_and_total() {
        let mut t = ContextTrie::new(100);
        let (main, a, b, hot) = (1, 2, 3, 4);
        t.add(&[main, a, hot], 2);
        t.add(&[main, b, hot], 1);
        t.add(&[main, a], 1);
        assert_eq!(t.total_samples(), 4);
        assert_eq!(t.len(), 1 + 5); // main, a, a.hot, b, b.hot
        let m = t.children(ROOT).next().unwrap();
        assert_eq!(t.node(m).total_count, 4);
        assert_eq!(t.node(m).self_count, 0);
        let a_node = t.children(m).find(|&c| t.node(c).frame == a).unwrap();
        assert_eq!((t.node(a_node).self_count, t.node(a_node).total_count), (1, 3));
        assert_eq!(t.path(t.children(a_node).next().unwrap()), vec![main, a, hot]);
        check_consistent(&t);
    }

    /// The node bound holds under many distinct contexts and folded samples are counted, with
    /// totals still consistent.
    #[test]
    fn memory_bound_folds_into_other() {
        let mut t = ContextTrie::new(64);
        for i in 0..10_000u32 {
            t.add(&[1, 2 + (i % 7), 100 + i], 1);
        }
        assert!(t.len() <= t.node_limit(), "{} > {}", t.len(), t.node_limit());
        let s = t.stats();
        assert_eq!(s.samples, 10_000);
        assert!(s.folded_samples > 9_000, "{s:?}");
        // Folded samples landed in [other] nodes under their known callers.
        let other_total: u64 = t.node_ids().filter(|&n| t.node(n).frame == FRAME_OTHER).map(|n| t.node(n).self_count).sum();
        assert!(other_total > 0);
        check_consistent(&t);
    }

    /// Folding the cold half keeps the hot contexts with their counts, moves the cold ones'
    /// samples into [other] under their callers, and keeps totals consistent.
    #[test]
    fn fold_cold_keeps_hot_contexts() {
        let mut t = ContextTrie::new(1000);
        t.add(&[1, 2, 3], 50); // hot
        for i in 0..20 {
            t.add(&[1, 2, 100 + i], 1); // cold siblings
        }
        t.add(&[1, 4], 1); // cold subtree under the root's child
        let freed = t.fold_cold();
        // 21 cold nodes removed, 2 [other] nodes added (under 2 and under 1).
        assert_eq!(freed, 19);
        check_consistent(&t);
        assert_eq!(t.total_samples(), 71);
        let hot = t.node_ids().find(|&n| t.node(n).frame == 3).expect("hot kept");
        assert_eq!(t.path(hot), vec![1, 2, 3]);
        assert_eq!(t.node(hot).self_count, 50);
        let others: Vec<_> = t.node_ids().filter(|&n| t.node(n).frame == FRAME_OTHER).collect();
        let folded: u64 = others.iter().map(|&n| t.node(n).self_count).sum();
        assert_eq!(folded, 21);
        assert_eq!(t.stats().folded_samples, 21);
        assert_eq!(t.stats().compactions, 1);
        // Re-adding a known hot context goes to the same place.
        let again = t.add(&[1, 2, 3], 1);
        assert_eq!(again, hot);
    }

    /// A trie too small to make room by folding still stays within its bound, counting every
    /// folded sample, with consistent totals.
    #[test]
    fn tiny_trie_stays_bounded() {
        let mut t = ContextTrie::new(2); // root + 1 node, spare 0
        t.add(&[1], 10);
        t.add(&[1, 2, 3], 5);
        for i in 0..100 {
            t.add(&[i, i + 1], 1);
        }
        assert!(t.len() <= t.node_limit());
        assert_eq!(t.total_samples(), 115);
        assert!(t.stats().folded_samples >= 105, "{:?}", t.stats());
        check_consistent(&t);
    }
}
