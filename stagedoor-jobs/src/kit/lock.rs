//! The poison-tolerant lock every backend uses for its short-held maps and counters.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, whatever a panic elsewhere left in it.
///
/// For values that stay whole at every step (a map updated by one insert or remove, a
/// counter, a state): a panic while the lock was held then leaves nothing half-written, and
/// one panic never makes every later caller fail.
///
/// ```
/// let m = std::sync::Mutex::new(1);
/// *stagedoor_jobs::kit::lock(&m) += 1;
/// assert_eq!(*stagedoor_jobs::kit::lock(&m), 2);
/// ```
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_poisoned_mutex_is_locked_with_what_it_holds() {
        let m = Arc::new(Mutex::new(7));
        let m2 = Arc::clone(&m);
        let _ = std::thread::spawn(move || {
            let _g = lock(&m2);
            panic!("poisons the mutex");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*lock(&m), 7);
    }
}
