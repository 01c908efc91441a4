//! etm-stacks: calling contexts of sampled user call stacks.
//!
//! * [`trie::ContextTrie`]: a calling-context trie keyed by interned, symbolized frames
//!   ([`frames::FrameTable`]) with self and total sample counts and an explicit node bound:
//!   when full, new contexts are folded into an `[other]` child of their deepest known caller
//!   (or into that caller itself once the spare budget is used), and every folded sample is
//!   counted in [`trie::TrieStats`].
//! * [`addrspace`]: `/proc/PID/maps` text and the ELF program headers of a mapped file (file
//!   offset != virtual address in PIE binaries), which the live driver turns into sideband.
//! * [`folded`] stacks (`outermost;...;leaf count`), read and written; the pprof and flame
//!   graph writers are in `etm-write`.
//!
//! The crate does no I/O of its own: callers hand it the maps text and the ELF bytes, and the
//! writers write to any `impl Write`. Corrupt input (bad maps lines, unparsable ELF files) is
//! counted and skipped, never fatal.
//!
//! ```
//! use etm_stacks::{frames::{Frame, FrameTable}, trie::ContextTrie};
//! let mut frames = FrameTable::new();
//! let main = frames.intern(Frame::new("main", None));
//! let hot = frames.intern(Frame::new("hot", None));
//! let mut trie = ContextTrie::new(1000);
//! trie.add(&[main, hot], 1);
//! let mut out = Vec::new();
//! etm_stacks::folded::write_folded(&trie, &frames, &mut out).unwrap();
//! assert_eq!(String::from_utf8(out).unwrap(), "main;hot 1\n");
//! ```

pub mod addrspace;
pub mod diff;
pub mod folded;
pub mod frames;
pub mod symtab;
pub mod trie;

pub use addrspace::BinaryId;
pub use frames::{Frame, FrameId, FrameTable};
pub use trie::ContextTrie;
