//! The machine to one test. A test that bounds how long the server takes (a stall
//! answered within the flush timeout) measures the server, not the other tests that
//! share two cores with it: it takes the machine alone, and every other test shares it.
//! Each `TestDb` holds a share for its life; `TestDb::alone()` waits until no share is
//! held and keeps new ones out until it is dropped. A thread that holds a share already
//! may take another (a test with two databases) even while a lone test waits, so the
//! gate cannot deadlock on one test's second database.

use std::cell::Cell;
use std::sync::{Condvar, Mutex};

#[derive(Default)]
struct State {
    shares: usize,
    alone: bool,
    waiting_alone: usize,
}

static STATE: Mutex<State> = Mutex::new(State {
    shares: 0,
    alone: false,
    waiting_alone: 0,
});
static CHANGED: Condvar = Condvar::new();

thread_local! {
    static HELD_HERE: Cell<usize> = const { Cell::new(0) };
}

/// Held by a test's database: the machine is shared.
pub struct Share {
    alone: bool,
}

impl Share {
    /// A share of the machine; waits while a lone test runs or waits to.
    pub fn shared() -> Share {
        let reentrant = HELD_HERE.with(|h| h.get() > 0);
        let mut s = STATE.lock().unwrap();
        while s.alone || (s.waiting_alone > 0 && !reentrant) {
            s = CHANGED.wait(s).unwrap();
        }
        s.shares += 1;
        HELD_HERE.with(|h| h.set(h.get() + 1));
        Share { alone: false }
    }

    /// The machine alone: waits until no other test holds a share.
    pub fn alone() -> Share {
        let mut s = STATE.lock().unwrap();
        s.waiting_alone += 1;
        while s.alone || s.shares > 0 {
            s = CHANGED.wait(s).unwrap();
        }
        s.waiting_alone -= 1;
        s.alone = true;
        Share { alone: true }
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut s = STATE.lock().unwrap();
        if self.alone {
            s.alone = false;
        } else {
            s.shares -= 1;
            // Dropped on another thread than it was taken on is fine: the count is
            // only a hint for reentrancy and never goes below zero.
            HELD_HERE.with(|h| h.set(h.get().saturating_sub(1)));
        }
        CHANGED.notify_all();
    }
}
