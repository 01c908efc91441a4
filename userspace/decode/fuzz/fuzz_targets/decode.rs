//! cargo-fuzz target: arbitrary bytes through the whole decoder (frame deformatter, packet
//! parsers, instruction-level decoder over a fixed A64/T32 code image), whole and chunked;
//! see `etm_decode::pipeline::fuzz::check`. Fails on any panic or whole/chunked difference.
#![no_main]

use etm_decode::image::MemoryImage;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // MemoryImage is not Sync (it caches the last region hit), so build one per thread.
    thread_local! {
        static IMG: MemoryImage = etm_decode::pipeline::fuzz::code_image();
    }
    IMG.with(|img| {
        etm_decode::pipeline::fuzz::check_with(data, img);
    });
});
