//! Aggregating an already-seen hybrid sample must not allocate (the hot path of live
//! collection): counted with a global allocator wrapper.

use etm_profile::{BinaryInfo, Branch, ExecSegment, HybridProfile, HybridSample, IdentityResolver};

#[global_allocator]
static A: etm_testutil::CountingAlloc = etm_testutil::CountingAlloc;

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
    let allocs = etm_testutil::count_allocations(|| {
        for _ in 0..10 {
            for (s, b) in stacks.iter().zip(&brs) {
                p.add(&HybridSample { stack: s, branches: b }, &r);
            }
        }
    });
    assert_eq!(allocs, 0, "allocations while aggregating seen samples");
    // The counter sees allocations (the zero above is not an uninstalled allocator).
    assert!(etm_testutil::count_allocations(|| drop(std::hint::black_box(vec![0u8; 64]))) >= 1);
    assert_eq!(p.total_samples(), 1100);
    assert_eq!(p.distinct_samples(), 100);
}
