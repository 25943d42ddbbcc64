//! Process-wide interning of the `&'static str` names an operation carries ("AllReduce",
//! "ncclFloat32", "sum", "RING", "SIMPLE"), so that a ring slot stores a `u16` per name in a
//! plain atomic word and a reader turns it back into the same `&'static str`.
//!
//! The table is keyed by the string's address and length: the hot path hashes a pointer (one
//! multiply) and compares it with one or two cells that are set once and then only read, so the
//! names of one operation cost a handful of loads. Two copies of one literal at different
//! addresses take two cells and read back as the same text. The table is bounded
//! (512 cells); a name that finds no cell reads back as [`OVERFLOW_NAME`].

use std::sync::OnceLock;

/// Cells in the table (a power of two). A name's index is its cell + 1, so 0 means "no name".
const TABLE: usize = 512;
/// Cells looked at from a name's hash before the slow scan.
const PROBES: usize = 8;

/// The index that stands for "no name" (`redop` of a collective without reduction).
pub(crate) const NONE: u16 = 0;
/// The index of a name that found no cell.
pub(crate) const OVERFLOW: u16 = u16::MAX;
/// What a name reads back as when the table had no cell left for it.
pub const OVERFLOW_NAME: &str = "?";

static NAMES: [OnceLock<&'static str>; TABLE] = [const { OnceLock::new() }; TABLE];

#[inline]
fn same(a: &str, b: &str) -> bool {
    std::ptr::eq(a.as_ptr(), b.as_ptr()) && a.len() == b.len()
}

#[inline]
fn home(s: &str) -> usize {
    let key = (s.as_ptr() as usize as u64) ^ ((s.len() as u64) << 48);
    // Fibonacci hashing: the top 9 bits of the product.
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - TABLE.trailing_zeros())) as usize
}

/// The index of `s`, claiming a cell on first use. The common case (the name sits in its home
/// cell) is inlined: a multiply and two dependent loads, which the five names of an operation
/// overlap.
#[inline(always)]
pub(crate) fn intern(s: &'static str) -> u16 {
    let h = home(s);
    if let Some(t) = NAMES[h].get() {
        if same(t, s) {
            return h as u16 + 1;
        }
    }
    intern_probe(s, h)
}

/// First use of a name, or its home cell is taken by another address: probe on.
#[cold]
#[inline(never)]
fn intern_probe(s: &'static str, h: usize) -> u16 {
    for k in 0..PROBES {
        let i = (h + k) & (TABLE - 1);
        let cell = &NAMES[i];
        let got = match cell.get() {
            Some(t) => *t,
            None => {
                // Another thread may win the race for this cell; whatever it stored is checked below.
                let _ = cell.set(s);
                match cell.get() {
                    Some(t) => *t,
                    None => continue,
                }
            }
        };
        if same(got, s) {
            return i as u16 + 1;
        }
    }
    intern_slow(s)
}

/// The probe window is taken by other addresses: any cell with the same text will do; failing
/// that, any free cell; failing that, [`OVERFLOW`].
#[cold]
fn intern_slow(s: &'static str) -> u16 {
    for (i, cell) in NAMES.iter().enumerate() {
        match cell.get() {
            Some(t) if *t == s => return i as u16 + 1,
            Some(_) => {}
            None => {
                let _ = cell.set(s);
                if cell.get().is_some_and(|t| *t == s) {
                    return i as u16 + 1;
                }
            }
        }
    }
    OVERFLOW
}

/// The name of an index from [`intern`]; `None` for [`NONE`].
pub(crate) fn lookup(i: u16) -> Option<&'static str> {
    if i == NONE {
        return None;
    }
    Some(NAMES.get(usize::from(i) - 1).and_then(|c| c.get()).copied().unwrap_or(OVERFLOW_NAME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_stable_index() {
        let a = intern("AllReduce");
        let b = intern("ncclFloat32");
        assert_ne!(a, NONE);
        assert_ne!(a, b);
        assert_eq!(intern("AllReduce"), a);
        assert_eq!(lookup(a), Some("AllReduce"));
        assert_eq!(lookup(b), Some("ncclFloat32"));
        assert_eq!(lookup(NONE), None);
        assert_eq!(lookup(OVERFLOW), Some(OVERFLOW_NAME));
    }

    #[test]
    fn same_text_at_another_address_reads_back_equal() {
        let leaked: &'static str = Box::leak(String::from("ReduceScatter").into_boxed_str());
        let i = intern(leaked);
        assert_eq!(lookup(i), Some("ReduceScatter"));
        assert_eq!(lookup(intern("ReduceScatter")), Some("ReduceScatter"));
    }
}
