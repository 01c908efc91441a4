//! What the host and the guest init exchange: the steps the guest runs (`/lab/steps.json` in
//! the initramfs) and the console lines it prints back.
//!
//! The console is the guest's only way out (the Debian kernel has virtio block and 9p as
//! modules, which the lab does not load), so results are printed as marked lines: a step's
//! exit status, and files base64-encoded between begin and end lines with their length and
//! FNV-1a hash, so a corrupted or cut transfer is detected rather than believed.

use serde::{Deserialize, Serialize};

/// Prefix of every protocol line.
pub const MARK: &str = "@@LAB";

/// One step of the guest's plan.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Step {
    /// Name (results are keyed by it).
    pub name: String,
    /// Program and arguments; `{pid:NAME}` is replaced by the pid of spawned step NAME.
    pub argv: Vec<String>,
    /// Extra environment.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Start in the background and go on (its pid is `{pid:NAME}`); killed at the end.
    #[serde(default)]
    pub spawn: bool,
    /// Wait this long before the next step (ms), after starting this one.
    #[serde(default)]
    pub settle_ms: u64,
    /// Kill the step after this many seconds (guest time).
    #[serde(default = "default_timeout")]
    pub timeout_s: u64,
    /// Files to send back after the step (missing ones are reported as such).
    #[serde(default)]
    pub files: Vec<String>,
}

fn default_timeout() -> u64 {
    120
}

/// 64-bit FNV-1a.
pub fn fnv1a(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding.
pub fn b64_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decodes [`b64_encode`]'s output (None on a character outside the alphabet).
pub fn b64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for ch in s.bytes() {
        if ch == b'=' {
            break;
        }
        let v = B64.iter().position(|&b| b == ch)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trip() {
        for n in 0..70usize {
            let data: Vec<u8> = (0..n).map(|i| (i * 37 + 11) as u8).collect();
            assert_eq!(b64_decode(&b64_encode(&data)).unwrap(), data, "{n}");
        }
        assert_eq!(b64_encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(b64_encode(b"fo"), "Zm8=");
    }
}
