//! An executor's room: its slots (reserved before a request is leased, so that it never
//! holds more than it can run) and the backlog mark (runnable rows may be waiting in
//! Postgres), which together decide when a freed slot wakes the sweeper.
//!
//! Every slot given back goes through `give_back`, whoever reserved it (the sweeper, the
//! write buffer, a resume, a fan-out): a slot the sweeper held while a batch was stored
//! unleased, given back after its claim came back empty, must wake it as surely as a
//! finished request's does, or those rows would wait for the next pass.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

pub(super) struct Room {
    capacity: usize,
    in_use: AtomicUsize,
    /// Runnable rows may be waiting in Postgres: set when a claim took all it asked for
    /// or found no room, or when rows were stored unleased; cleared by the sweeper before
    /// each look and by the wake it is given.
    backlog: AtomicBool,
    /// Free slots that wake the sweeper while `backlog` is set: a few at a time, so that
    /// a backlog is claimed in batches, not one statement per finished request.
    refill: usize,
}

impl Room {
    pub(super) fn new(capacity: usize, refill: usize) -> Room {
        Room {
            capacity,
            in_use: AtomicUsize::new(0),
            backlog: AtomicBool::new(false),
            refill: refill.max(1),
        }
    }

    /// Slots in all: none on an instance that only takes API calls.
    pub(super) fn capacity(&self) -> usize {
        self.capacity
    }

    pub(super) fn free(&self) -> usize {
        self.capacity
            .saturating_sub(self.in_use.load(Ordering::Relaxed))
    }

    /// Reserves up to `n` slots; returns how many were reserved.
    pub(super) fn reserve(&self, n: usize) -> usize {
        let mut cur = self.in_use.load(Ordering::Relaxed);
        loop {
            let take = n.min(self.capacity.saturating_sub(cur));
            if take == 0 {
                return 0;
            }
            match self.in_use.compare_exchange_weak(
                cur,
                cur + take,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return take,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Gives back `n` reserved slots; true when the sweeper must be woken for them.
    #[must_use]
    pub(super) fn give_back(&self, n: usize) -> bool {
        if n > 0 {
            self.in_use.fetch_sub(n, Ordering::AcqRel);
        }
        self.wake_for_backlog()
    }

    /// Marks runnable rows as maybe waiting; true when free slots should claim them now.
    #[must_use]
    pub(super) fn mark_backlog(&self) -> bool {
        self.backlog.store(true, Ordering::Relaxed);
        self.wake_for_backlog()
    }

    /// Marks the backlog without waking anyone (the sweeper marks it for itself).
    pub(super) fn set_backlog(&self) {
        self.backlog.store(true, Ordering::Relaxed);
    }

    /// Cleared by the sweeper before its look, never after it: rows committed unleased
    /// while the claim runs (which its snapshot cannot see) mark the backlog again, and
    /// that mark must survive the sweep, or the slots it gives back would wake no one.
    pub(super) fn clear_backlog(&self) {
        self.backlog.store(false, Ordering::Relaxed);
    }

    /// True, once per mark, when the backlog is marked and enough slots are free to claim
    /// a few rows at once.
    fn wake_for_backlog(&self) -> bool {
        self.backlog.load(Ordering::Relaxed)
            && self.free() >= self.refill
            && self.backlog.swap(false, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::Room;

    /// The sweeper holds every slot while its claim runs; a batch committed meanwhile
    /// finds no room and is stored unleased, and nothing else runs. The claim's snapshot
    /// saw none of those rows: the slots it gives back must wake it for them.
    #[test]
    fn slots_a_claim_gives_back_wake_it_for_rows_stored_meanwhile() {
        let room = Room::new(2, 1);
        room.clear_backlog();
        assert_eq!(room.reserve(8), 2, "the sweeper reserves what is free");
        assert_eq!(room.reserve(5), 0, "the batch finds no room");
        assert!(!room.mark_backlog(), "no slot is free to claim them yet");
        assert!(
            room.give_back(2),
            "the empty claim's slots must wake the sweeper"
        );
        assert!(!room.give_back(0), "one wake per mark");
    }

    #[test]
    fn a_freed_slot_wakes_only_while_rows_may_wait_and_only_once_refilled() {
        let room = Room::new(8, 2);
        assert_eq!(room.reserve(8), 8);
        assert!(!room.give_back(1), "no backlog: nothing to claim");
        room.set_backlog();
        assert!(!room.give_back(0), "one free slot is below the refill");
        assert!(room.give_back(1), "two free: claim them");
        assert!(!room.give_back(1), "the mark was taken by that wake");
        assert_eq!(room.free(), 3);
        assert_eq!(room.reserve(9), 3, "never more than is free");
    }
}
