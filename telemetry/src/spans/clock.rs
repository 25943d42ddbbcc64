//! One clock for every exporter: nanoseconds since the Unix epoch, read from the monotonic clock
//! against an anchor taken once per process, so spans never run backwards when NTP steps the
//! wall clock and all communicators of a process share one time base.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

struct Anchor {
    unix_ns: u64,
    at: Instant,
}

static ANCHOR: OnceLock<Anchor> = OnceLock::new();

fn anchor() -> &'static Anchor {
    ANCHOR.get_or_init(|| {
        let at = Instant::now();
        let unix_ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        Anchor { unix_ns, at }
    })
}

/// Now, in nanoseconds since the Unix epoch.
#[inline]
pub fn unix_nanos() -> u64 {
    let a = anchor();
    a.unix_ns + a.at.elapsed().as_nanos() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_and_near_the_wall_clock() {
        let a = unix_nanos();
        let b = unix_nanos();
        assert!(b >= a);
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_nanos() as u64;
        assert!(wall.abs_diff(b) < 1_000_000_000, "wall {wall} vs span clock {b}");
    }
}
