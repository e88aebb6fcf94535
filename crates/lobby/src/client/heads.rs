//! One memory budget for every request head still arriving (`--max-head-memory`).
//!
//! A head may take up to 64 KiB and `--header-timeout` to arrive, so many clients that start
//! heads and never finish them could hold a great deal of memory. Each connection reading a
//! head holds a [`HeadTicket`] saying how much its buffer holds; when the total passes the
//! budget, the oldest incomplete heads are told to give up (their clients get 408) until the
//! total is back under it. Complete requests are not counted and are served as usual.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};

/// The heads being read, oldest first.
pub struct HeadBudget {
    limit: usize,
    held: Cell<usize>,
    next_id: Cell<u64>,
    tickets: RefCell<BTreeMap<u64, Rc<TicketState>>>,
}

#[derive(Default)]
struct TicketState {
    bytes: Cell<usize>,
    evicted: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

/// One connection's share of the budget while its head arrives; gives it back when dropped.
pub struct HeadTicket {
    budget: Rc<HeadBudget>,
    id: u64,
    state: Rc<TicketState>,
}

impl HeadBudget {
    pub fn new(limit: usize) -> Rc<HeadBudget> {
        Rc::new(HeadBudget { limit, held: Cell::new(0), next_id: Cell::new(0), tickets: RefCell::new(BTreeMap::new()) })
    }

    /// A ticket for a head that starts arriving now, the newest.
    pub fn ticket(self: &Rc<HeadBudget>) -> HeadTicket {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        let state = Rc::new(TicketState::default());
        self.tickets.borrow_mut().insert(id, state.clone());
        HeadTicket { budget: self.clone(), id, state }
    }

    /// Tells the oldest heads to give up until the total is within the budget.
    fn evict_oldest(&self) {
        while self.held.get() > self.limit {
            let Some((_, oldest)) = self.tickets.borrow_mut().pop_first() else { return };
            self.held.set(self.held.get() - oldest.bytes.get());
            oldest.evicted.set(true);
            let waker = oldest.waker.borrow_mut().take();
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    }
}

impl HeadTicket {
    /// The connection's head buffer now holds `bytes`; may evict older heads, or this one.
    pub fn hold(&self, bytes: usize) {
        if self.state.evicted.get() {
            return;
        }
        let before = self.state.bytes.replace(bytes);
        self.budget.held.set(self.budget.held.get() - before + bytes);
        self.budget.evict_oldest();
    }

    /// Resolves once this head has been chosen to give up its memory.
    pub async fn evicted(&self) {
        poll_fn(|cx| {
            if self.state.evicted.get() {
                Poll::Ready(())
            } else {
                *self.state.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

impl Drop for HeadTicket {
    fn drop(&mut self) {
        if !self.state.evicted.get() {
            self.budget.tickets.borrow_mut().remove(&self.id);
            self.budget.held.set(self.budget.held.get() - self.state.bytes.get());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_budget_the_oldest_heads_are_evicted_first() {
        let budget = HeadBudget::new(100);
        let oldest = budget.ticket();
        let middle = budget.ticket();
        let newest = budget.ticket();
        oldest.hold(40);
        middle.hold(40);
        assert_eq!(budget.held.get(), 80);
        newest.hold(50);
        assert!(oldest.state.evicted.get());
        assert!(!middle.state.evicted.get() && !newest.state.evicted.get());
        assert_eq!(budget.held.get(), 90);
        // An evicted ticket no longer counts, now or when it goes.
        oldest.hold(1000);
        drop(oldest);
        assert_eq!(budget.held.get(), 90);
        drop(middle);
        assert_eq!(budget.held.get(), 50);
    }

    #[test]
    fn a_head_alone_over_the_budget_evicts_itself() {
        let budget = HeadBudget::new(100);
        let only = budget.ticket();
        only.hold(101);
        assert!(only.state.evicted.get());
        assert_eq!(budget.held.get(), 0);
    }

    #[test]
    fn eviction_wakes_the_connection() {
        let budget = HeadBudget::new(10);
        let waiting = budget.ticket();
        let newer = budget.ticket();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            tokio::join!(waiting.evicted(), async {
                tokio::task::yield_now().await;
                newer.hold(11);
            });
        });
        assert!(newer.state.evicted.get() && waiting.state.evicted.get());
    }
}
