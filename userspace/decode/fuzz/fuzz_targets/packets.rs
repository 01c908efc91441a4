//! cargo-fuzz target: arbitrary bytes through the frame deformatter and the ETMv4/ETE packet
//! parsers (configuration chosen by the first bytes), whole and chunked; see
//! `etm_decode::packet::fuzz::check`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    etm_decode::packet::fuzz::check(data);
});
