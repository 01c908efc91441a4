//! Writers (in progress).
