//! perf-script reader (in progress).
