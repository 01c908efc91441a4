//! Aggregating an already-seen hybrid sample must not allocate (the hot path of live
//! collection): counted with a global allocator wrapper.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use etm_profile::{BinaryInfo, Branch, ExecSegment, HybridProfile, HybridSample, IdentityResolver};

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);
thread_local! {
    /// Only the measuring thread counts (the test harness allocates on other threads).
    static ACTIVE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn count() {
    if ACTIVE.try_with(|a| a.get()).unwrap_or(false) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// After each distinct sample was seen once, adding them all again allocates nothing.
#[test]
fn seen_samples_do_not_allocate() {
    let r = IdentityResolver::new(vec![BinaryInfo {
        path: "/a/app".into(),
        exec_segments: vec![ExecSegment { vaddr: 0x1000, memsz: 0x10000, offset: 0x1000 }],
        code_ranges: vec![(0x1000, 0x11000)],
        ..Default::default()
    }]);
    let stacks: Vec<Vec<u64>> = (0..100u64).map(|i| vec![0x1100 + i, 0x2000 + i % 7, 0x3000]).collect();
    let brs: Vec<Vec<Branch>> =
        (0..100u64).map(|i| (0..16).map(|j| Branch { from: 0x1000 + i * j, to: 0x1200 + j }).collect()).collect();
    let mut p = HybridProfile::default();
    for (s, b) in stacks.iter().zip(&brs) {
        p.add(&HybridSample { stack: s, branches: b }, &r);
    }
    let before = ALLOCS.load(Ordering::Relaxed);
    ACTIVE.with(|a| a.set(true));
    for _ in 0..10 {
        for (s, b) in stacks.iter().zip(&brs) {
            p.add(&HybridSample { stack: s, branches: b }, &r);
        }
    }
    ACTIVE.with(|a| a.set(false));
    let after = ALLOCS.load(Ordering::Relaxed);
    assert_eq!(after - before, 0, "allocations while aggregating seen samples");
    assert_eq!(p.total_samples(), 1100);
    assert_eq!(p.distinct_samples(), 100);
}
