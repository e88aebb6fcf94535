//! The watcher of hibernating connections: wakes a sleeper when its client speaks (it gets a
//! task again, `opening::resume`), closes it when its time is up, and at a binary upgrade hands
//! every sleeper it can to the new maitred.

use std::rc::Rc;
use std::time::Instant;

use super::asleep::{Hibernation, Sleeper, EVENTS_PER_WAIT, TICK};
use super::opening;
use crate::client::context::Context;
use crate::log::{debug, warning_limited};

/// The watcher: wakes sleepers when their client speaks, closes them when their time is up.
pub async fn watch(context: Rc<Context>) {
    let hibernation = &context.hibernation;
    let mut ticks = tokio::time::interval(TICK);
    let mut shutdown = context.shutdown.clone();
    let mut woken = Vec::new();
    loop {
        tokio::select! {
            ready = hibernation.epoll.readable() => {
                let Ok(mut ready) = ready else { return };
                let taken = hibernation.take_woken(&mut woken);
                for sleeper in woken.drain(..) {
                    opening::resume(&context, sleeper);
                }
                match taken {
                    Ok(n) if n < EVENTS_PER_WAIT => ready.clear_ready(),
                    // A full batch: there may be more. tokio's readiness is no budgeted
                    // operation, so without a yield this loop would take the next batch, and
                    // the next, before any other task (or the driver) ran again.
                    Ok(_) => tokio::task::yield_now().await,
                    Err(e) => {
                        // Left ready, the set would be asked again at once, and fail again.
                        ready.clear_ready();
                        warning_limited!("waiting for hibernating connections failed: {e}");
                    }
                }
            }
            _ = ticks.tick() => {
                let shutting_down = *shutdown.borrow();
                for sleeper in hibernation.take_http2_ending(Instant::now(), shutting_down) {
                    opening::resume(&context, sleeper);
                }
                if let (true, Some(successor)) = (shutting_down, context.successor()) {
                    // A binary upgrade: the new maitred takes every idle connection it can,
                    // those whose client has spoken too (it reads what they sent). One it cannot
                    // take (`Sleeper::can_move`) sleeps on here, and is answered here when its
                    // client speaks.
                    for sleeper in take_all_woken(hibernation, &mut woken) {
                        if sleeper.can_move() {
                            successor.hand_over(sleeper);
                        } else {
                            opening::resume(&context, sleeper);
                        }
                    }
                    for sleeper in hibernation.take_movable() {
                        successor.hand_over(sleeper);
                    }
                } else if shutting_down {
                    // A request that has arrived is answered (with `Connection: close`), not
                    // lost with its connection.
                    for sleeper in take_all_woken(hibernation, &mut woken) {
                        opening::resume(&context, sleeper);
                    }
                }
                let closed = hibernation.close_expired(Instant::now(), context.closing());
                if closed > 0 {
                    debug!("closed {closed} idle connections");
                }
                hibernation.trim_memory();
            }
            // Wake the tick at once when a shutdown begins, so idle connections close now.
            _ = shutdown.changed() => ticks.reset_immediately(),
        }
    }
}

/// Every sleeper readable now, in as many batches as that takes, and no more batches than the
/// sleepers there were: each batch takes at least one out of the set, or the set has no more.
fn take_all_woken<'a>(hibernation: &Hibernation, woken: &'a mut Vec<Sleeper>) -> std::vec::Drain<'a, Sleeper> {
    for _ in 0..=hibernation.sleeping().div_ceil(EVENTS_PER_WAIT) {
        match hibernation.take_woken(woken) {
            Ok(n) if n == EVENTS_PER_WAIT => {}
            _ => break,
        }
    }
    woken.drain(..)
}
