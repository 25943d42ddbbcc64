//! Small per-process thread numbers for CPU rows (`tid`), with the thread's name for Perfetto's
//! thread labels. A thread registers once, on its first row.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};

static NEXT: AtomicU32 = AtomicU32::new(1);
/// Registered threads beyond this keep their number but get no name row.
const MAX_NAMED: usize = 4096;
static NAMES: Mutex<Vec<(u32, String)>> = Mutex::new(Vec::new());

thread_local! {
    static TID: u32 = register();
}

fn register() -> u32 {
    let tid = NEXT.fetch_add(1, Relaxed);
    let name = std::thread::current().name().map_or_else(|| format!("thread {tid}"), str::to_owned);
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    if names.len() < MAX_NAMED {
        names.push((tid, name));
    }
    tid
}

/// This thread's number (1, 2, …); 0 while the thread is being torn down.
pub(crate) fn current() -> u32 {
    TID.try_with(|t| *t).unwrap_or(0)
}

/// Every registered thread's number and name.
pub(crate) fn names() -> Vec<(u32, String)> {
    NAMES.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_per_thread_and_named() {
        let here = current();
        assert_eq!(current(), here);
        let there = std::thread::Builder::new()
            .name("trace-test-thread".into())
            .spawn(current)
            .expect("spawn")
            .join()
            .expect("join");
        assert_ne!(here, there);
        assert!(names().iter().any(|(t, n)| *t == there && n == "trace-test-thread"));
    }
}
