//! State of the live view: a plain struct updated from immutable snapshots and key presses,
//! unit-tested without a terminal.

use std::collections::HashSet;

use etm_stacks::{FrameTable, trie::ContextTrie};

/// Sort key of the context table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    /// Samples whose leaf context is the row.
    SelfSamples,
    /// Samples passing through the row's context.
    Total,
    /// Instructions the row's leaf function executed in the decoded trace (exact, ETM).
    Instructions,
}

impl SortKey {
    /// Label for the header.
    pub fn label(self) -> &'static str {
        match self {
            SortKey::SelfSamples => "self",
            SortKey::Total => "total",
            SortKey::Instructions => "instructions",
        }
    }
}

/// One calling context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextRow {
    /// Trie node id (stable across snapshots of the same trie).
    pub node: u32,
    /// Self samples.
    pub self_count: u64,
    /// Total samples.
    pub total_count: u64,
    /// Frames, leaf first, callers after.
    pub frames: Vec<String>,
}

/// The status line's numbers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Status {
    /// Target pid and command.
    pub target: String,
    /// `running`, `exited`, ...
    pub target_state: String,
    /// Samples per second over the last interval.
    pub samples_per_s: f64,
    /// Samples in the profile.
    pub samples: u64,
    /// Samples dropped (kernel side: ring full + stack errors).
    pub dropped: u64,
    /// Perf event used.
    pub event: String,
    /// Branch source (`none`, `lbr`).
    pub branches: String,
    /// Mean stack depth.
    pub depth_mean: f64,
    /// Fraction of samples with at most 2 frames.
    pub shallow: f64,
    /// Contexts in the trie / folded samples.
    pub nodes: usize,
    /// Samples folded by the trie's memory bound.
    pub folded: u64,
    /// Stacks cut at a return address not preceded by a call.
    pub truncated: u64,
}

/// An immutable view of the profile for the UI.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Samples in the profile.
    pub total: u64,
    /// Hot contexts (top by self and by total).
    pub rows: Vec<ContextRow>,
    /// Status numbers.
    pub status: Status,
    /// Per function name: its exact counts from the decoded trace (empty without ETM).
    pub instr: std::collections::HashMap<String, ExactFigures>,
}

/// A function's exact counts from the decoded trace, as the view shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ExactFigures {
    /// Share of the traced instructions.
    pub share: f64,
    /// Calls complete inside a window, and the instructions per call over them, self and
    /// inclusive (`None` without complete calls).
    pub complete_calls: u64,
    pub self_per_call: Option<f64>,
    pub inclusive_per_call: Option<f64>,
}

impl ExactFigures {
    /// Per function name (one name in several binaries: shares add up, the per-call figures
    /// are weighted by the complete calls).
    pub fn by_name(functions: &[etm_session::pipeline::ExactFunction]) -> std::collections::HashMap<String, ExactFigures> {
        let mut m: std::collections::HashMap<String, (ExactFigures, f64, f64)> = std::collections::HashMap::new();
        for f in functions {
            let c = &f.count;
            let e = m.entry(f.function.clone()).or_default();
            e.0.share += c.share;
            e.0.complete_calls += c.complete_calls;
            let k = c.complete_calls as f64;
            if let (Some(s), Some(i)) = (c.self_per_call, c.inclusive_per_call) {
                e.1 += k * s.value;
                e.2 += k * i.value;
            }
        }
        m.into_iter()
            .map(|(name, (mut x, s, i))| {
                if x.complete_calls > 0 {
                    let k = x.complete_calls as f64;
                    (x.self_per_call, x.inclusive_per_call) = (Some(s / k), Some(i / k));
                }
                (name, x)
            })
            .collect()
    }
}

impl Snapshot {
    /// The exact counts of a row's leaf function, if the trace counted it.
    pub fn instr_of(&self, r: &ContextRow) -> Option<&ExactFigures> {
        r.frames.first().and_then(|f| self.instr.get(f))
    }

    /// The exact instruction share of a row's leaf function, if the trace counted it.
    pub fn instr_share(&self, r: &ContextRow) -> Option<f64> {
        self.instr_of(r).map(|x| x.share)
    }
}

/// Builds the rows of a snapshot: the `limit` hottest contexts by self count and by total.
pub fn rows_from_trie(trie: &ContextTrie, frames: &FrameTable, limit: usize) -> Vec<ContextRow> {
    let mut by_self: Vec<u32> = trie.node_ids().filter(|&n| trie.node(n).self_count > 0).collect();
    by_self.sort_unstable_by_key(|&n| std::cmp::Reverse(trie.node(n).self_count));
    by_self.truncate(limit);
    let mut by_total: Vec<u32> = trie.node_ids().collect();
    by_total.sort_unstable_by_key(|&n| std::cmp::Reverse(trie.node(n).total_count));
    by_total.truncate(limit);
    let mut seen = HashSet::new();
    let mut path = Vec::new();
    by_self
        .into_iter()
        .chain(by_total)
        .filter(|n| seen.insert(*n))
        .map(|n| {
            trie.path_into(n, &mut path);
            let node = trie.node(n);
            ContextRow {
                node: n,
                self_count: node.self_count,
                total_count: node.total_count,
                frames: path.iter().rev().map(|&f| frames.get(f).function.clone()).collect(),
            }
        })
        .collect()
}

/// Keys the view reacts to (terminal-independent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// A character.
    Char(char),
    /// Up arrow.
    Up,
    /// Down arrow.
    Down,
    /// Page up.
    PageUp,
    /// Page down.
    PageDown,
    /// Enter.
    Enter,
    /// Escape.
    Esc,
    /// Backspace.
    Backspace,
    /// Ctrl-C.
    CtrlC,
}

/// The live view's state.
#[derive(Debug, Clone)]
pub struct App {
    /// Current sort key.
    pub sort: SortKey,
    /// Case-insensitive substring filter on frame names.
    pub filter: String,
    /// True while the filter is being typed.
    pub editing_filter: bool,
    /// Index of the selected row among the visible rows.
    pub selected: usize,
    /// Expanded rows (by trie node).
    pub expanded: HashSet<u32>,
    /// The data shown.
    pub snapshot: Snapshot,
    /// Set when the user asked to quit.
    pub quit: bool,
}

impl Default for App {
    fn default() -> Self {
        App {
            sort: SortKey::SelfSamples,
            filter: String::new(),
            editing_filter: false,
            selected: 0,
            expanded: HashSet::new(),
            snapshot: Snapshot::default(),
            quit: false,
        }
    }
}

impl App {
    /// Replaces the data, keeping sort, filter and expansion; clamps the selection.
    pub fn set_snapshot(&mut self, s: Snapshot) {
        self.snapshot = s;
        self.clamp();
    }

    fn clamp(&mut self) {
        let n = self.visible().len();
        self.selected = self.selected.min(n.saturating_sub(1));
    }

    /// The rows shown: filtered, then sorted by the sort key (ties by node id).
    pub fn visible(&self) -> Vec<&ContextRow> {
        let needle = self.filter.to_lowercase();
        let mut rows: Vec<&ContextRow> = self
            .snapshot
            .rows
            .iter()
            .filter(|r| {
                (self.sort != SortKey::SelfSamples || r.self_count > 0)
                    && (needle.is_empty() || r.frames.iter().any(|f| f.to_lowercase().contains(&needle)))
            })
            .collect();
        match self.sort {
            SortKey::SelfSamples => rows.sort_by(|a, b| b.self_count.cmp(&a.self_count).then(a.node.cmp(&b.node))),
            SortKey::Total => rows.sort_by(|a, b| b.total_count.cmp(&a.total_count).then(a.node.cmp(&b.node))),
            SortKey::Instructions => {
                // Leaf contexts only (a function's instructions are its own), by the share.
                rows.retain(|r| r.self_count > 0);
                let share = |r: &ContextRow| self.snapshot.instr_share(r).unwrap_or(-1.0);
                rows.sort_by(|a, b| share(b).total_cmp(&share(a)).then(b.self_count.cmp(&a.self_count)).then(a.node.cmp(&b.node)))
            }
        }
        rows
    }

    /// True if the row of `node` is expanded (all callers shown).
    pub fn is_expanded(&self, node: u32) -> bool {
        self.expanded.contains(&node)
    }

    /// Handles a key press.
    pub fn on_key(&mut self, key: Key) {
        if key == Key::CtrlC {
            self.quit = true;
            return;
        }
        if self.editing_filter {
            match key {
                Key::Char(c) => self.filter.push(c),
                Key::Backspace => {
                    self.filter.pop();
                }
                Key::Enter => self.editing_filter = false,
                Key::Esc => {
                    self.filter.clear();
                    self.editing_filter = false;
                }
                _ => {}
            }
            self.selected = 0;
            self.clamp();
            return;
        }
        match key {
            Key::Char('q') => self.quit = true,
            Key::Char('s') => {
                self.sort = match self.sort {
                    SortKey::SelfSamples => SortKey::Total,
                    SortKey::Total | SortKey::Instructions => SortKey::SelfSamples,
                };
                self.selected = 0;
            }
            Key::Char('i') => {
                self.sort = if self.sort == SortKey::Instructions { SortKey::SelfSamples } else { SortKey::Instructions };
                self.selected = 0;
            }
            Key::Char('/') => self.editing_filter = true,
            Key::Esc => self.filter.clear(),
            Key::Up | Key::Char('k') => self.selected = self.selected.saturating_sub(1),
            Key::Down | Key::Char('j') => self.selected += 1,
            Key::PageUp => self.selected = self.selected.saturating_sub(10),
            Key::PageDown => self.selected += 10,
            Key::Enter | Key::Char(' ') | Key::Char('e') => {
                if let Some(node) = self.visible().get(self.selected).map(|r| r.node)
                    && !self.expanded.remove(&node)
                {
                    self.expanded.insert(node);
                }
            }
            Key::Char('c') => self.expanded.clear(),
            _ => {}
        }
        self.clamp();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etm_stacks::Frame;

    fn snapshot() -> Snapshot {
        let mut f = FrameTable::new();
        let main = f.intern(Frame::new("main", None));
        let a = f.intern(Frame::new("a", None));
        let b = f.intern(Frame::new("b", None));
        let hot1 = f.intern(Frame::new("hot1", None));
        let hot2 = f.intern(Frame::new("hot2", None));
        let mut t = ContextTrie::new(100);
        t.add(&[main, a, hot1], 6);
        t.add(&[main, b, hot2], 3);
        t.add(&[main, b], 1);
        Snapshot { total: t.total_samples(), rows: rows_from_trie(&t, &f, 50), ..Default::default() }
    }

    /// Self sort lists leaf contexts hottest first, with frames leaf first.
    #[test]
    fn sorts_by_self_then_total() {
        let mut app = App::default();
        app.set_snapshot(snapshot());
        let v = app.visible();
        assert_eq!(v.len(), 3);
        assert_eq!(v[0].frames, vec!["hot1", "a", "main"]);
        assert_eq!(v[0].self_count, 6);
        app.on_key(Key::Char('s'));
        assert_eq!(app.sort, SortKey::Total);
        let v = app.visible();
        assert_eq!(v[0].frames, vec!["main"]);
        assert_eq!(v[0].total_count, 10);
        assert_eq!(v.len(), 5); // main, a, a.hot1, b, b.hot2
    }

    /// The filter matches any frame of the context, typed after '/', cleared by Esc.
    #[test]
    fn filter_and_escape() {
        let mut app = App::default();
        app.set_snapshot(snapshot());
        for k in [Key::Char('/'), Key::Char('H'), Key::Char('o'), Key::Char('t'), Key::Char('2')] {
            app.on_key(k);
        }
        assert!(app.editing_filter);
        app.on_key(Key::Enter);
        let v = app.visible();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].frames[0], "hot2");
        // 'q' typed while not editing quits; while editing it would be text.
        app.on_key(Key::Esc);
        assert_eq!(app.visible().len(), 3);
        app.on_key(Key::Char('q'));
        assert!(app.quit);
    }

    /// `i` ranks leaf contexts by their function's exact instruction share, and toggles back.
    #[test]
    fn instructions_ranking() {
        let mut app = App::default();
        let mut s = snapshot();
        s.instr = [("hot2".to_string(), 0.7), ("hot1".to_string(), 0.2)]
            .into_iter()
            .map(|(f, share)| (f, ExactFigures { share, ..Default::default() }))
            .collect();
        app.set_snapshot(s);
        app.on_key(Key::Char('i'));
        assert_eq!(app.sort, SortKey::Instructions);
        let v = app.visible();
        let leaves: Vec<&str> = v.iter().map(|r| r.frames[0].as_str()).collect();
        assert_eq!(leaves, ["hot2", "hot1", "b"]);
        assert_eq!(app.snapshot.instr_share(v[0]), Some(0.7));
        app.on_key(Key::Char('i'));
        assert_eq!(app.sort, SortKey::SelfSamples);
    }

    /// One name in two binaries: shares add up, per-call figures weighted by complete calls.
    #[test]
    fn exact_figures_by_name() {
        use etm_profile::exact::{FunctionCount, Ratio};
        let r = |v: f64| Some(Ratio { value: v, stderr: 0.0, ci: (v, v) });
        let f =
            |binary: &str, share: f64, k: u64, own: Option<Ratio>, incl: Option<Ratio>| etm_session::pipeline::ExactFunction {
                binary: binary.into(),
                function: "f".into(),
                count: FunctionCount {
                    function: 0,
                    instructions: 1,
                    segments: 1,
                    share,
                    stderr: 0.0,
                    ci: (share, share),
                    inclusive: 1,
                    calls: k,
                    complete_calls: k,
                    self_per_call: own,
                    inclusive_per_call: incl,
                    blocks: 1,
                    branches: 0,
                },
            };
        let m = ExactFigures::by_name(&[f("/a", 0.25, 10, r(4.0), r(8.0)), f("/b", 0.5, 30, r(8.0), r(12.0))]);
        assert_eq!(
            m["f"],
            ExactFigures { share: 0.75, complete_calls: 40, self_per_call: Some(7.0), inclusive_per_call: Some(11.0) }
        );
        let m = ExactFigures::by_name(&[f("/a", 0.25, 0, None, None)]);
        assert_eq!((m["f"].self_per_call, m["f"].inclusive_per_call), (None, None));
    }

    /// Enter toggles expansion of the selected row; the selection stays within bounds.
    #[test]
    fn expand_collapse_and_selection_bounds() {
        let mut app = App::default();
        app.set_snapshot(snapshot());
        for _ in 0..10 {
            app.on_key(Key::Down);
        }
        assert_eq!(app.selected, 2);
        let node = app.visible()[2].node;
        app.on_key(Key::Enter);
        assert!(app.is_expanded(node));
        app.on_key(Key::Enter);
        assert!(!app.is_expanded(node));
        app.on_key(Key::Enter);
        app.on_key(Key::Char('c'));
        assert!(app.expanded.is_empty());
        // A smaller snapshot clamps the selection.
        let mut s = snapshot();
        s.rows.truncate(1);
        app.set_snapshot(s);
        assert_eq!(app.selected, 0);
        app.on_key(Key::CtrlC);
        assert!(app.quit);
    }
}
