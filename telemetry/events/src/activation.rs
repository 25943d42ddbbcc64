//! NCCL's process-global activation mask: the one `int` every profiler plugin's `init` receives a
//! pointer to (reference §4). Plugins may change it at any time with atomic stores; occl reads it
//! with a relaxed load when an operation captures its mask.
//!
//! `OCCL_PROFILE_EVENT_MASK` (or `NCCL_PROFILE_EVENT_MASK`) gives its starting value, so a plugin
//! that leaves the mask alone still gets events; a plugin's `init` usually overwrites it.

use crate::mask::{EventMask, ParseMaskError};
use std::sync::atomic::{AtomicI32, Ordering::Relaxed};
use std::sync::Once;

static MASK: AtomicI32 = AtomicI32::new(0);
static FROM_ENV: Once = Once::new();

/// The global mask cell (for a C plugin's `int*`: `global().as_ptr()`).
pub fn global() -> &'static AtomicI32 {
    &MASK
}

/// The mask's current value (only the 32 bits of NCCL's `int`).
#[inline]
pub fn current() -> EventMask {
    EventMask(u64::from(MASK.load(Relaxed) as u32))
}

/// Sets the mask (what `exampleProfilerStart(mask)` does in NCCL's example plugin).
pub fn set(mask: EventMask) {
    MASK.store(mask.0 as u32 as i32, Relaxed);
}

/// Sets the starting value from the environment, once per process; later calls do nothing and
/// return `Ok`. A malformed value is returned (the mask stays as it was) so the caller can say so.
pub fn init_from_env() -> Result<(), ParseMaskError> {
    let mut res = Ok(());
    FROM_ENV.call_once(|| match EventMask::from_env() {
        Ok(Some(m)) => set(m),
        Ok(None) => {}
        Err(e) => res = Err(e),
    });
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventType;

    #[test]
    fn set_and_read_through_the_c_pointer() {
        set(EventMask::of(EventType::Coll));
        assert_eq!(current(), EventMask(2));
        // A plugin writes through the pointer it got in init.
        global().store(0x7fff, Relaxed);
        assert_eq!(current(), EventMask::ALL);
        set(EventMask::NONE);
        assert!(current().is_empty());
    }
}
