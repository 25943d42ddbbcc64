//! Names a span keeps: descriptors borrow their strings for one call, spans outlive it. NCCL's
//! spellings come from the static tables; anything else is leaked once, up to a bound, so a
//! plugin host sending ever-new strings cannot grow memory without limit.

use crate::nccl::names::{self, Field};
use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

/// Distinct unknown names kept; later ones read "Unknown".
const MAX_LEAKED: usize = 1024;

static LEAKED: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);

/// `s`, read from a descriptor's `field`, as a `'static` string: NCCL's exact spelling is found
/// in that field's table alone, anything else as [`intern`] finds it.
pub fn intern_field(field: Field, s: &str) -> &'static str {
    names::exact(field, s).unwrap_or_else(|| intern(s))
}

/// `s` as a `'static` string.
pub fn intern(s: &str) -> &'static str {
    if let Some(k) = names::known(s) {
        return k;
    }
    if s.is_empty() {
        return "";
    }
    let mut g = LEAKED.lock().unwrap_or_else(PoisonError::into_inner);
    let set = g.get_or_insert_with(HashSet::new);
    if let Some(k) = set.get(s) {
        return k;
    }
    if set.len() >= MAX_LEAKED {
        return "Unknown";
    }
    let k: &'static str = Box::leak(s.to_owned().into_boxed_str());
    set.insert(k);
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_names_are_the_tables_and_others_are_kept_once() {
        assert!(std::ptr::eq(intern("AllReduce"), intern(&String::from("AllReduce"))));
        assert_eq!(intern("ring"), "RING");
        assert!(std::ptr::eq(intern_field(Field::Proto, "SIMPLE"), intern("SIMPLE")));
        assert_eq!(intern_field(Field::Algo, "ring"), "RING");
        let a = intern(&String::from("occl-test-name"));
        let b = intern(&String::from("occl-test-name"));
        assert!(std::ptr::eq(a, b));
        assert_eq!(a, "occl-test-name");
    }
}
