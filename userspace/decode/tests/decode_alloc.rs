//! The decode hot path allocates nothing per packet or element: after a warm-up (buffers and
//! the P0 stack reach their working size), decoding another 512 KiB of a real capture
//! (`bugfix-exact-match`, ~850 k elements) must not touch the heap. Counted with a global
//! allocator wrapper.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};

use etm_decode::elements::Element;
use etm_decode::pipeline::{BufferDecoder, snapshot_image};
use etm_decode::snapshot::{DirFiles, Snapshot, SnapshotFiles};

mod common;
use common::shared_dir;

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// No heap allocation while decoding after warm-up.
#[test]
fn steady_state_decode_does_not_allocate() {
    let dir = shared_dir().join("testdata/etm/bugfix-exact-match");
    if !dir.is_dir() {
        etm_testutil::skip(format!("{} not found (set ETM_BPF_SHARED)", dir.display()));
        return;
    }
    let files = DirFiles::new(&dir);
    let snap = Snapshot::parse(&files).unwrap();
    let buf = snap.first_buffer().unwrap().clone();
    let data = files.read(&buf.file).unwrap();
    let (img, _) = snapshot_image(&snap, &files);
    let mut bd = BufferDecoder::for_snapshot(&snap, &buf);
    let n = std::cell::Cell::new(0u64);
    let mut sink = |_: &Element| {
        n.set(n.get() + 1);
        ControlFlow::Continue(())
    };
    let half = data.len() / 2;
    for c in data[..half].chunks(4096) {
        let _ = bd.push(c, &img, &mut sink);
    }
    let warm = n.get();
    let before = ALLOCS.load(Ordering::Relaxed);
    for c in data[half..].chunks(4096) {
        let _ = bd.push(c, &img, &mut sink);
    }
    let allocs = ALLOCS.load(Ordering::Relaxed) - before;
    let steady = n.get() - warm;
    eprintln!("{steady} elements decoded after warm-up with {allocs} allocations");
    assert!(steady > 100_000, "too few elements: {steady}");
    assert_eq!(allocs, 0, "heap allocations on the decode hot path");
}
