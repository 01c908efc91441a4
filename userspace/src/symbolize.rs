//! Symbolization of link-time addresses with `addr2line` (gimli: DWARF, inline frames
//! included; ELF symbol table as fallback), cached per `(binary, address)`.
//!
//! (blazesym 0.2.7 was tried first: on clang-22 DWARF 5 binaries it named some functions
//! after base types, e.g. `a` as "signed char", so it is not used.)

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use etm_stacks::{Frame, FrameId, FrameTable};

/// Cache entries beyond which the cache is cleared (bounded memory).
const CACHE_LIMIT: usize = 1 << 20;
/// Frames in the table beyond which unknown addresses are no longer told apart (one
/// `[binary]` frame per binary instead of `[binary+0xaddr]`), bounding the frame table.
const UNKNOWN_DETAIL_LIMIT: usize = 100_000;

/// Symbolizes addresses of the binaries of one address space into interned frames.
#[derive(Default)]
pub struct Symbolizer {
    loaders: HashMap<u32, Option<addr2line::Loader>>,
    cache: HashMap<(u32, u64), Box<[FrameId]>>,
    /// Addresses symbolized (cache misses).
    pub lookups: u64,
    /// Lookups that found no symbol.
    pub unknown: u64,
}

impl Symbolizer {
    /// An empty symbolizer.
    pub fn new() -> Symbolizer {
        Symbolizer::default()
    }

    /// Appends the frames of `link_addr` in binary `binary` to `out`, outermost (the real
    /// function) first, then its inlined callees. `path` is the binary's path in the target's
    /// mount namespace, reached through `root` (e.g. `/proc/PID/root`, or `""`). With a
    /// `build_id`, separate debug info in `/usr/lib/debug/.build-id/` is preferred.
    #[allow(clippy::too_many_arguments)]
    pub fn frames(
        &mut self,
        binary: u32,
        root: &str,
        path: &str,
        build_id: Option<&[u8]>,
        link_addr: u64,
        table: &mut FrameTable,
        out: &mut Vec<FrameId>,
    ) {
        if let Some(ids) = self.cache.get(&(binary, link_addr)) {
            out.extend_from_slice(ids);
            return;
        }
        self.lookups += 1;
        let loader = self.loaders.entry(binary).or_insert_with(|| {
            let debug = build_id.filter(|id| id.len() >= 2).map(|id| {
                let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
                Path::new("/usr/lib/debug/.build-id").join(&hex[..2]).join(format!("{}.debug", &hex[2..]))
            });
            let rooted = PathBuf::from(format!("{root}{path}"));
            let file = match debug.filter(|p| p.exists()) {
                Some(d) => d,
                None if rooted.exists() => rooted,
                None => PathBuf::from(path),
            };
            addr2line::Loader::new(&file).map_err(|e| log::info!("no symbols for {}: {e}", file.display())).ok()
        });
        let mut names: Vec<String> = Vec::new();
        if let Some(loader) = loader {
            if let Ok(mut it) = loader.find_frames(link_addr) {
                // Innermost (inlined callee) first.
                while let Ok(Some(f)) = it.next() {
                    if let Some(name) = f.function.as_ref().and_then(|n| n.demangle().ok()) {
                        names.push(name.into_owned());
                    }
                }
            }
            if names.is_empty()
                && let Some(sym) = loader.find_symbol(link_addr)
            {
                names.push(addr2line::demangle_auto(sym.into(), None).into_owned());
            }
        }
        let mut ids: Vec<FrameId> = names.iter().rev().map(|n| table.intern(Frame::new(n.as_str(), Some(binary)))).collect();
        if ids.is_empty() {
            self.unknown += 1;
            let frame = if table.len() < UNKNOWN_DETAIL_LIMIT {
                unknown_frame(binary, path, Some(link_addr))
            } else {
                unknown_frame(binary, path, None)
            };
            ids.push(table.intern(frame));
        }
        if self.cache.len() >= CACHE_LIMIT {
            self.cache.clear();
        }
        out.extend_from_slice(&ids);
        self.cache.insert((binary, link_addr), ids.into_boxed_slice());
    }
}

fn unknown_frame(binary: u32, display_name: &str, link_addr: Option<u64>) -> Frame {
    let base = display_name.rsplit('/').next().unwrap_or(display_name);
    match link_addr {
        Some(a) => Frame::new(format!("[{base}+{a:#x}]"), Some(binary)),
        None => Frame::new(format!("[{base}]"), Some(binary)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Symbolizes a C binary compiled at test time, with an inlined function, at addresses
    /// found independently by `nm`; the inline chain comes out outermost first.
    #[test]
    fn symbolizes_test_binary_with_inlines() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("t.c");
        let exe = dir.path().join("t");
        std::fs::write(
            &src,
            "static inline __attribute__((always_inline)) int leaf(int x) { \
               for (int i = 0; i < 100; i++) x = x * 3 + i; return x; }\n\
             __attribute__((noinline)) int outer(int x) { return leaf(x) + 1; }\n\
             __attribute__((noinline)) int a(int x) { return outer(x) * 2; }\n\
             int main(int c, char **v) { return a(c); }\n",
        )
        .unwrap();
        let cc = ["clang-22", "clang", "gcc", "cc"].into_iter().find(|c| Command::new(c).arg("--version").output().is_ok());
        let Some(cc) = cc else {
            etm_testutil::skip("no C compiler found");
            return;
        };
        let st = Command::new(cc).args(["-O2", "-g", "-o"]).arg(&exe).arg(&src).status().unwrap();
        assert!(st.success());
        let Some(nm) = ["nm", "llvm-nm-22", "llvm-nm"]
            .into_iter()
            .find_map(|t| Command::new(t).arg(&exe).output().ok().filter(|o| o.status.success()))
        else {
            etm_testutil::skip("no nm (binutils) or llvm-nm to read the symbol table independently");
            return;
        };
        let nm = String::from_utf8(nm.stdout).unwrap();
        let addr_of = |name: &str| {
            nm.lines()
                .find_map(|l| {
                    let mut it = l.split_whitespace();
                    let (a, _, n) = (it.next()?, it.next()?, it.next()?);
                    (n == name).then(|| u64::from_str_radix(a, 16).unwrap())
                })
                .unwrap_or_else(|| panic!("{name} in nm output"))
        };
        let outer = addr_of("outer");
        let exe_s = exe.to_str().unwrap();
        let mut s = Symbolizer::new();
        let mut table = FrameTable::new();
        let mut out = Vec::new();
        // Walk the function body: some address must be inside the inlined `leaf`.
        let mut saw_inline = false;
        // Walk the function body up to the next symbol (nm order): some address must be
        // inside the inlined `leaf`, and every address must belong to `outer`.
        let next = nm
            .lines()
            .filter_map(|l| u64::from_str_radix(l.split_whitespace().next()?, 16).ok())
            .filter(|&a| a > outer)
            .min()
            .unwrap();
        for addr in outer..next {
            out.clear();
            s.frames(0, "", exe_s, None, addr, &mut table, &mut out);
            assert_eq!(table.get(out[0]).function, "outer", "address {addr:#x}");
            if out.len() == 2 {
                assert_eq!(table.get(out[1]).function, "leaf");
                saw_inline = true;
            }
        }
        assert!(saw_inline, "no inlined frame found in outer");
        // A one-letter function name (blazesym 0.2.7 named these after DWARF base types).
        out.clear();
        s.frames(0, "", exe_s, None, addr_of("a"), &mut table, &mut out);
        assert_eq!(table.get(out[0]).function, "a");
        // A cached lookup gives the same frames without another DWARF lookup.
        let before = s.lookups;
        out.clear();
        s.frames(0, "", exe_s, None, outer, &mut table, &mut out);
        assert_eq!(s.lookups, before);
        // An address outside any symbol is an unknown frame named after the binary.
        out.clear();
        s.frames(1, "", "/x/t", None, 0x10, &mut table, &mut out);
        assert_eq!(table.get(out[0]).function, "[t+0x10]");
    }
}
