//! How many connections are in each state of their life, and how many have been in it for
//! over a second (clients slow to send or to read), for `maitred_connections` and the
//! diagnoses. Hibernating connections are counted by `asleep.rs`; the queued and
//! in-service split of `Awaiting` comes from the queue (`crate::seating`).
//!
//! Each connection holds a `StateMark`; moving it costs a few increments on one thread. The
//! age is kept without a timer per connection: the diagnoses tick every `TICK`, each tick
//! starts an epoch, and a connection counts in its epoch's slot until `SLOTS` ticks have
//! passed, when the slot's count moves to the state's "old" count.
//!
//! Every state a connection's task moves through, and what moves it on (h11's rule: the table
//! lives in the file that owns the states; docs/DESIGN.md has the whole life, asleep included):
//!
//! | state | the task is | next |
//! |---|---|---|
//! | `Idle` | waiting, without a buffer, for a request (`http1/task.rs`) | `Reading` when bytes arrive; asleep after `HIBERNATE_AFTER`; closed at `--keep-alive` |
//! | `Reading` | reading a head or a body (`http1/read.rs`, `h2/stream.rs`) | `Awaiting` once the request is whole; `Writing` to refuse it |
//! | `Awaiting` | queued, or with a worker (`http1/task.rs`, `h2/stream.rs`) | `Writing` with the answer's first part |
//! | `Writing` | writing the answer (`write.rs`) | `Idle` when it keeps alive; closed otherwise |
//! | `WebSocket` | relaying an accepted WebSocket (`websocket.rs`) | closed when the WebSocket closes |

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

/// How often `tick` is called (by `observe/diagnosis.rs`).
pub const TICK: Duration = Duration::from_millis(500);
/// A connection in a state for this many ticks is old: 1 to 1.5 s with a 0.5 s tick.
const SLOTS: usize = 3;
/// How long a connection has been in its state, at least, once it counts as old.
pub const OLD_AFTER: Duration = Duration::from_millis(TICK.as_millis() as u64 * (SLOTS as u64 - 1));

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectionState {
    /// Waiting, without a buffer, for the client's next request.
    Idle,
    /// Reading a request's head or body.
    Reading,
    /// The request is complete: queued for a worker, or with one.
    Awaiting,
    /// Writing the answer.
    Writing,
    /// An accepted WebSocket, for its life.
    WebSocket,
}

const STATES: usize = 5;

#[derive(Default)]
pub struct ConnectionStates {
    epoch: Cell<u32>,
    recent: [[Cell<u32>; SLOTS]; STATES],
    old: [Cell<u32>; STATES],
}

impl ConnectionStates {
    /// A new connection's mark, in `state`.
    pub fn mark(self: &Rc<Self>, state: ConnectionState) -> StateMark {
        let epoch = self.epoch.get();
        self.enter(state, epoch);
        StateMark { states: self.clone(), state, epoch }
    }

    /// Connections in `state` now.
    pub fn count(&self, state: ConnectionState) -> u32 {
        let recent: u32 = self.recent[state as usize].iter().map(Cell::get).sum();
        recent + self.old[state as usize].get()
    }

    /// Connections with a request or a WebSocket under way: in any state but `Idle`.
    pub fn busy(&self) -> u32 {
        [ConnectionState::Reading, ConnectionState::Awaiting, ConnectionState::Writing, ConnectionState::WebSocket]
            .into_iter()
            .map(|state| self.count(state))
            .sum()
    }

    /// Connections in `state` for at least `OLD_AFTER`.
    pub fn old(&self, state: ConnectionState) -> u32 {
        self.old[state as usize].get()
    }

    /// A new epoch: the connections that entered their state `SLOTS` epochs ago are old.
    pub fn tick(&self) {
        let epoch = self.epoch.get().wrapping_add(1);
        self.epoch.set(epoch);
        let slot = epoch as usize % SLOTS;
        for state in 0..STATES {
            let aged = self.recent[state][slot].replace(0);
            add(&self.old[state], aged as i64);
        }
    }

    fn enter(&self, state: ConnectionState, epoch: u32) {
        add(&self.recent[state as usize][epoch as usize % SLOTS], 1);
    }

    fn leave(&self, state: ConnectionState, epoch: u32) {
        if self.epoch.get().wrapping_sub(epoch) as usize >= SLOTS {
            add(&self.old[state as usize], -1);
        } else {
            add(&self.recent[state as usize][epoch as usize % SLOTS], -1);
        }
    }
}

fn add(cell: &Cell<u32>, by: i64) {
    cell.set((cell.get() as i64 + by).max(0) as u32);
}

/// A connection's place in the counts; it leaves them when dropped.
pub struct StateMark {
    states: Rc<ConnectionStates>,
    state: ConnectionState,
    epoch: u32,
}

impl StateMark {
    pub fn set(&mut self, state: ConnectionState) {
        if state == self.state {
            return;
        }
        self.states.leave(self.state, self.epoch);
        self.epoch = self.states.epoch.get();
        self.state = state;
        self.states.enter(state, self.epoch);
    }
}

impl Drop for StateMark {
    fn drop(&mut self) {
        self.states.leave(self.state, self.epoch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_old_after_slots_ticks_and_leaves_its_count() {
        let states = Rc::new(ConnectionStates::default());
        let mut slow = states.mark(ConnectionState::Reading);
        let quick = states.mark(ConnectionState::Reading);
        assert_eq!(states.count(ConnectionState::Reading), 2);
        for _ in 0..SLOTS - 1 {
            states.tick();
        }
        assert_eq!(states.old(ConnectionState::Reading), 0);
        drop(quick);
        states.tick();
        assert_eq!(states.old(ConnectionState::Reading), 1);
        assert_eq!(states.count(ConnectionState::Reading), 1);
        slow.set(ConnectionState::Writing);
        assert_eq!(states.count(ConnectionState::Reading), 0);
        assert_eq!(states.old(ConnectionState::Reading), 0);
        assert_eq!(states.count(ConnectionState::Writing), 1);
        assert_eq!(states.old(ConnectionState::Writing), 0);
        drop(slow);
        assert_eq!(states.count(ConnectionState::Writing), 0);
    }

    #[test]
    fn many_ticks_keep_an_old_connection_old_once() {
        let states = Rc::new(ConnectionStates::default());
        let mark = states.mark(ConnectionState::Writing);
        for _ in 0..100 {
            states.tick();
        }
        assert_eq!(states.old(ConnectionState::Writing), 1);
        assert_eq!(states.count(ConnectionState::Writing), 1);
        drop(mark);
        assert_eq!(states.count(ConnectionState::Writing), 0);
    }
}
