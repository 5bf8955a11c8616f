//! The order a claim takes due jobs in, chosen by the runtime ([`ClaimOrder`]), and the count
//! behind the choice ([`FairTurn`]): every [`FAIR_CLAIM_EVERY`](crate::FAIR_CLAIM_EVERY)-th
//! claim that takes jobs is made in due order alone, so that no priority level starves. The
//! rule lives here, once, for every backend: a backend takes jobs in the order it is told.

/// In which order [`Broker::claim`](crate::broker::Broker::claim) takes the due jobs of a
/// queue. The runtime chooses it ([`FairTurn`]); a backend only follows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ClaimOrder {
    /// The highest [`Priority`](crate::Priority) first, in due order among equals.
    #[default]
    Priority,
    /// Due order alone, whatever the level: the jobs that waited longest first. On Redis, the
    /// level whose oldest waiting job is the oldest is read first.
    Due,
}

/// A queue's count of the claims that took jobs, which picks each claim's [`ClaimOrder`]:
/// the [`FAIR_CLAIM_EVERY`](crate::FAIR_CLAIM_EVERY)-th, 2×..-th claim that takes jobs is in
/// [`Due`](ClaimOrder::Due) order, the others by [`Priority`](ClaimOrder::Priority). A claim
/// that takes nothing is not counted: a due-order claim that finds nothing is tried again by
/// the next claim.
#[derive(Debug, Default)]
pub struct FairTurn {
    taken: std::sync::atomic::AtomicU64,
}

impl FairTurn {
    /// The order of the next claim.
    pub fn order(&self) -> ClaimOrder {
        let taken = self.taken.load(std::sync::atomic::Ordering::Relaxed);
        if taken
            .wrapping_add(1)
            .is_multiple_of(crate::FAIR_CLAIM_EVERY)
        {
            ClaimOrder::Due
        } else {
            ClaimOrder::Priority
        }
    }

    /// A claim took `n` jobs: counted when `n` is not zero.
    pub fn claimed(&self, n: usize) {
        if n > 0 {
            self.taken
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{ClaimOrder, FairTurn};

    #[test]
    fn every_eighth_claim_that_takes_jobs_is_in_due_order() {
        let turn = FairTurn::default();
        let mut orders = Vec::new();
        for i in 0..17 {
            orders.push(turn.order());
            // Every other claim between takes nothing; it is not counted.
            turn.claimed(0);
            turn.claimed(usize::from(i != 3) * 2);
        }
        let due: Vec<usize> = orders
            .iter()
            .enumerate()
            .filter(|(_, o)| **o == ClaimOrder::Due)
            .map(|(i, _)| i)
            .collect();
        // Claim 3 took nothing, so the 8th that took jobs is claim 8 (0-based).
        assert_eq!(due, vec![8, 16]);
    }
}
