//! The worker scoreboard: each worker's generation, state, current request and count, as
//! `/status.json`, the page and `maitred top` show them; and why workers left, counted by
//! reason (`maitred_worker_exits_total`).
//!
//! A leaf: the supervisor and a worker's task share a worker's `Card` (through its `Seat`),
//! and the stats listener and the diagnoses read them here.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use maitred_shm::LoopBeat;
use tokio::sync::{watch, Notify};

/// What the supervisor wants of a worker; the worker's task follows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Ready, but no request may be seated at it yet: a reload's new worker waits for the rest
    /// of its set, and the spare waits for a worker to retire.
    Hold,
    Serve,
    /// No new request, no new offer: it answers what it holds, then its channel is closed.
    Retire,
}

/// A worker's state as the scoreboard shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerState {
    /// Forked or asked for, and not yet ready: it imports the application.
    Starting,
    /// Ready and held: the spare, or a reload's worker waiting for the rest of its set.
    Held,
    Idle,
    Busy,
    /// Answering what it holds before it exits.
    Retiring,
}

impl WorkerState {
    pub const ALL: [WorkerState; 5] =
        [WorkerState::Starting, WorkerState::Held, WorkerState::Idle, WorkerState::Busy, WorkerState::Retiring];

    pub fn label(self) -> &'static str {
        match self {
            WorkerState::Starting => "starting",
            WorkerState::Held => "held",
            WorkerState::Idle => "idle",
            WorkerState::Busy => "busy",
            WorkerState::Retiring => "retiring",
        }
    }
}

/// Why a worker left the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitReason {
    /// It exited or its channel failed on its own: a crash, `os._exit`, a SIGKILL from outside.
    Crash,
    /// Killed by the kernel's OOM killer, as its memory cgroup counted (supervise/oom.rs).
    OomKill,
    /// Killed at `--timeout`.
    Timeout,
    /// Alive but did not read a request sent to it idle; killed.
    Wedged,
    /// Found stopped (SIGSTOP) when a request was to go to it.
    Stopped,
    /// It could not load the application.
    BootFailed,
    /// Recycled after `--max-requests`.
    MaxRequests,
    /// Recycled over `--max-worker-memory`.
    Memory,
    /// Recycled past `--max-worker-lifetime`.
    Lifetime,
    /// Replaced by a reload's new generation (SIGHUP).
    Reload,
    /// One worker fewer (SIGTTOU).
    ScaleDown,
}

impl ExitReason {
    pub const ALL: [ExitReason; 11] = [
        ExitReason::Crash,
        ExitReason::OomKill,
        ExitReason::Timeout,
        ExitReason::Wedged,
        ExitReason::Stopped,
        ExitReason::BootFailed,
        ExitReason::MaxRequests,
        ExitReason::Memory,
        ExitReason::Lifetime,
        ExitReason::Reload,
        ExitReason::ScaleDown,
    ];

    /// The metric's label and status.json's key.
    pub fn label(self) -> &'static str {
        match self {
            ExitReason::Crash => "crash",
            ExitReason::OomKill => "oom_kill",
            ExitReason::Timeout => "timeout",
            ExitReason::Wedged => "wedged",
            ExitReason::Stopped => "stopped",
            ExitReason::BootFailed => "boot_failed",
            ExitReason::MaxRequests => "max_requests",
            ExitReason::Memory => "memory",
            ExitReason::Lifetime => "lifetime",
            ExitReason::Reload => "reload",
            ExitReason::ScaleDown => "scale_down",
        }
    }

    /// Recycling: the worker was healthy and retired on a limit.
    pub fn is_recycling(self) -> bool {
        matches!(self, ExitReason::MaxRequests | ExitReason::Memory | ExitReason::Lifetime)
    }

    /// The worker failed: its request, if it had one, was answered 502/504 or went elsewhere.
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            ExitReason::Crash | ExitReason::OomKill | ExitReason::Timeout | ExitReason::Wedged | ExitReason::Stopped
        )
    }
}

/// The period of an ASGI worker's event-loop heartbeat (python/maitred/watchdog.py's `BEAT`).
pub const LOOP_BEAT: Duration = Duration::from_millis(100);

/// What a thread is busy with: its request's summary (`GET /path HTTP/1.1`) and since when.
pub type Busy = (Rc<str>, Instant);

/// A worker's line on the scoreboard, shared by the supervisor and the worker's task.
pub struct Card {
    pub generation: u64,
    pub pid: Cell<Option<i32>>,
    /// When it was asked for.
    pub born: Instant,
    /// It has loaded the application.
    pub ready: Cell<bool>,
    /// It runs an ASGI application on an event loop: --timeout cancels a request there, and
    /// kills the worker only when the loop is blocked.
    pub asgi: Cell<bool>,
    pub phase: watch::Sender<Phase>,
    /// What each of its threads is busy with (`GET /path HTTP/1.1`) and since when: a line per
    /// thread, each a seat of its own (docs/PROTOCOL.md, section 4). Since its seating, or,
    /// once its answer has started, since the answer's last piece: what --timeout counts, as a
    /// thread's stream is cut only when silent that long (issue 47, item 4).
    pub threads: RefCell<Vec<Option<Busy>>>,
    /// Requests it has taken, all its threads together.
    pub served: Cell<u64>,
    /// Its resident bytes at the diagnoses' last look (every 500 ms), kept once it has gone:
    /// the last RSS that a kill's log line names.
    pub resident: Cell<Option<u64>>,
    /// An ASGI worker's requests admitted whose answers have not started: what admission
    /// counts against `--worker-connections` (docs/ASGI.md).
    pub admitted: Cell<usize>,
    /// An ASGI worker's requests whose answers have started and not ended (streams and open
    /// WebSockets), which cost its admission nothing.
    pub streams: Cell<usize>,
    /// An ASGI worker's admitted requests whose answers have not started, by their ids: what
    /// `--timeout` still applies to, so what `long_request` and the timeout lines name.
    pub requests: RefCell<BTreeMap<u32, Busy>>,
    /// An ASGI worker's event-loop heartbeat, read from its region while it serves.
    pub loop_beat: RefCell<Option<Box<dyn Fn() -> LoopBeat>>>,
    /// The heartbeat last seen change, and when the lobby saw it.
    beat_seen: Cell<(u64, Instant)>,
    /// When one of its threads last answered.
    answered_at: Cell<Option<Instant>>,
    /// Told when one of its threads has answered: its idle threads waiting for it to have CPU to
    /// spare look again (`gate.rs`).
    answered: Notify,
}

impl Card {
    pub fn new(generation: u64, phase: Phase) -> Card {
        Card {
            generation,
            pid: Cell::new(None),
            born: Instant::now(),
            ready: Cell::new(false),
            asgi: Cell::new(false),
            phase: watch::Sender::new(phase),
            threads: RefCell::new(vec![None]),
            served: Cell::new(0),
            resident: Cell::new(None),
            admitted: Cell::new(0),
            streams: Cell::new(0),
            requests: RefCell::default(),
            loop_beat: RefCell::default(),
            beat_seen: Cell::new((0, Instant::now())),
            answered: Notify::new(),
            answered_at: Cell::new(None),
        }
    }

    pub fn state(&self) -> WorkerState {
        match *self.phase.borrow() {
            _ if !self.ready.get() => WorkerState::Starting,
            Phase::Retire => WorkerState::Retiring,
            Phase::Hold => WorkerState::Held,
            Phase::Serve if self.busy_threads() > 0 || self.admitted.get() > 0 => WorkerState::Busy,
            Phase::Serve => WorkerState::Idle,
        }
    }

    /// The worker has come with `threads` channels: a line for each.
    pub fn set_threads(&self, threads: usize) {
        *self.threads.borrow_mut() = vec![None; threads];
    }

    pub fn busy_threads(&self) -> usize {
        self.threads.borrow().iter().filter(|line| line.is_some()).count()
    }

    /// The request one of its threads has been on longest, or, an ASGI worker, the admitted
    /// request that has waited longest for its answer to start, if any.
    pub fn longest_request(&self) -> Option<Busy> {
        self.running().into_iter().min_by_key(|(_, since)| *since)
    }

    /// What it is busy with: each busy thread's request, and an ASGI worker's admitted requests
    /// whose answers have not started (its streams are not work: docs/ASGI.md, "Streams").
    pub fn running(&self) -> Vec<Busy> {
        let threads = self.threads.borrow();
        let requests = self.requests.borrow();
        threads.iter().flatten().chain(requests.values()).cloned().collect()
    }

    /// Thread `thread` takes a request.
    pub fn begin(&self, thread: usize, summary: Rc<str>) {
        self.served.set(self.served.get() + 1);
        self.threads.borrow_mut()[thread] = Some((summary, Instant::now()));
    }

    /// Thread `thread`'s answer has had a piece more: its silence counts from now.
    pub fn produced(&self, thread: usize) {
        if let Some((_, since)) = self.threads.borrow_mut()[thread].as_mut() {
            *since = Instant::now();
        }
    }

    /// Thread `thread` has answered.
    pub fn end(&self, thread: usize) {
        let mut threads = self.threads.borrow_mut();
        threads[thread] = None;
        self.answered_at.set(Some(Instant::now()));
        if threads.len() > 1 {
            self.answered.notify_waiters();
        }
    }

    /// Resolves when one of its threads next answers.
    pub async fn answered(&self) {
        self.answered.notified().await;
    }

    /// How late an ASGI worker's event loop is now: the last heartbeat's lag, or, when no beat
    /// has come for longer than one period since the lobby last saw one, that silence past the
    /// period (a loop blocked now, whose last beat was on time). None from a worker that
    /// publishes no heartbeat (WSGI) or none yet. The silence counts from when the lobby saw
    /// the beat, never earlier than it came, so it never overstates the lag.
    pub fn loop_lag(&self, now: Instant) -> Option<Duration> {
        let beat = self.loop_beat.borrow().as_ref().map(|read| read())?;
        if beat.beats == 0 {
            return None;
        }
        let (seen, seen_at) = self.beat_seen.get();
        if beat.beats != seen {
            self.beat_seen.set((beat.beats, now));
            return Some(beat.lag);
        }
        let silence = now.saturating_duration_since(seen_at).saturating_sub(LOOP_BEAT);
        Some(beat.lag.max(silence))
    }

    /// An ASGI worker was given request `id`.
    pub fn admit(&self, id: u32, summary: Rc<str>) {
        self.served.set(self.served.get() + 1);
        self.requests.borrow_mut().insert(id, (summary, Instant::now()));
        self.admitted.set(self.requests.borrow().len());
    }

    /// Request `id`'s answer started, or it ended before: it is no longer admitted work.
    pub fn started(&self, id: u32) {
        if self.requests.borrow_mut().remove(&id).is_some() {
            self.answered_at.set(Some(Instant::now()));
        }
        self.admitted.set(self.requests.borrow().len());
    }

    /// Whether none of its threads has answered for `quiet` (or ever): the worker may have been
    /// stopped since (`health::LOOK_AFTER_IDLE`). One that answered on any thread was running.
    pub fn quiet_for(&self, quiet: Duration) -> bool {
        self.answered_at.get().is_none_or(|at| at.elapsed() >= quiet)
    }
}

/// How far back `recent_exits` looks.
pub const RECENT: Duration = Duration::from_secs(60);

/// Every worker's card, by the supervisor's number for it, and the exits counted by reason.
pub struct Scoreboard {
    /// The generation that serves: 1 for the workers started with the lobby, one more for
    /// each reload that completes.
    pub generation: Cell<u64>,
    cards: RefCell<BTreeMap<usize, Rc<Card>>>,
    exits: [Cell<u64>; ExitReason::ALL.len()],
    /// Exits of the last minute, for the diagnoses.
    recent: RefCell<VecDeque<(Instant, ExitReason)>>,
}

impl Default for Scoreboard {
    fn default() -> Scoreboard {
        Scoreboard {
            generation: Cell::new(1),
            cards: RefCell::default(),
            exits: Default::default(),
            recent: RefCell::default(),
        }
    }
}

impl Scoreboard {
    pub fn add(&self, id: usize, card: Rc<Card>) {
        self.cards.borrow_mut().insert(id, card);
    }

    pub fn remove(&self, id: usize) {
        self.cards.borrow_mut().remove(&id);
    }

    pub fn clear(&self) {
        self.cards.borrow_mut().clear();
    }

    /// Every card, by number (so the oldest first).
    pub fn cards(&self) -> Vec<Rc<Card>> {
        self.cards.borrow().values().cloned().collect()
    }

    /// How many workers are in each state, in `WorkerState::ALL`'s order.
    pub fn counts(&self) -> [usize; WorkerState::ALL.len()] {
        let mut counts = [0; WorkerState::ALL.len()];
        for card in self.cards.borrow().values() {
            counts[card.state() as usize] += 1;
        }
        counts
    }

    /// Busy and free seats of the workers that serve (idle or busy): those a request can be
    /// seated at now, and those taken. A WSGI worker's seats are its threads; an ASGI worker's,
    /// on its one channel, are the `worker_connections` requests it may have admitted whose
    /// answers have not started: its open streams take none (docs/ASGI.md, "Streams and
    /// admission"), so a worker full of idle streams is not busy.
    pub fn seats(&self, worker_connections: usize) -> [usize; 2] {
        let mut seats = [0, 0];
        for card in self.cards.borrow().values() {
            if matches!(card.state(), WorkerState::Idle | WorkerState::Busy) {
                let (busy, all) = if card.asgi.get() && card.threads.borrow().len() == 1 {
                    (card.admitted.get(), worker_connections.max(card.admitted.get()))
                } else {
                    (card.busy_threads(), card.threads.borrow().len())
                };
                seats[0] += busy;
                seats[1] += all - busy;
            }
        }
        seats
    }

    pub fn exited(&self, reason: ExitReason) {
        let count = &self.exits[reason as usize];
        count.set(count.get() + 1);
        let now = Instant::now();
        let mut recent = self.recent.borrow_mut();
        recent.push_back((now, reason));
        while recent.front().is_some_and(|(at, _)| now.duration_since(*at) > RECENT) {
            recent.pop_front();
        }
    }

    /// Exits since the lobby started, in `ExitReason::ALL`'s order.
    pub fn exits(&self) -> [u64; ExitReason::ALL.len()] {
        std::array::from_fn(|index| self.exits[index].get())
    }

    /// How many exits of the last `RECENT` `select` picks.
    pub fn recent_exits(&self, select: impl Fn(ExitReason) -> bool) -> usize {
        let now = Instant::now();
        self.recent.borrow().iter().filter(|(at, reason)| now.duration_since(*at) <= RECENT && select(*reason)).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_card_is_quiet_until_any_of_its_threads_answers() {
        let card = Card::new(1, Phase::Serve);
        card.set_threads(2);
        let hour = Duration::from_secs(3600);
        assert!(card.quiet_for(hour), "never answered");
        card.begin(1, "GET / HTTP/1.1".into());
        assert!(card.quiet_for(hour), "busy, not answered yet");
        card.end(1);
        assert!(!card.quiet_for(hour), "thread 1 answered: thread 0 need not look");
        assert!(card.quiet_for(Duration::ZERO));
    }

    #[test]
    fn a_card_goes_from_starting_to_busy_to_retiring() {
        let card = Card::new(1, Phase::Serve);
        assert_eq!(card.state(), WorkerState::Starting);
        card.ready.set(true);
        assert_eq!(card.state(), WorkerState::Idle);
        card.begin(0, "GET / HTTP/1.1".into());
        assert_eq!(card.state(), WorkerState::Busy);
        assert_eq!(card.served.get(), 1);
        card.end(0);
        card.set_threads(3);
        card.begin(1, "GET /a HTTP/1.1".into());
        card.begin(2, "GET /b HTTP/1.1".into());
        assert_eq!((card.state(), card.busy_threads()), (WorkerState::Busy, 2));
        assert_eq!(&*card.longest_request().unwrap().0, "GET /a HTTP/1.1");
        let board = Scoreboard::default();
        board.add(0, Rc::new(card));
        assert_eq!(board.seats(32), [2, 1]);
        let card = board.cards().pop().unwrap();
        card.phase.send_replace(Phase::Retire);
        assert_eq!(board.seats(32), [0, 0], "a retiring worker's threads are no seats");
        assert_eq!(card.state(), WorkerState::Retiring);
    }

    #[test]
    fn an_asgi_workers_seats_are_its_admissions_and_its_streams_take_none() {
        let card = Rc::new(Card::new(1, Phase::Serve));
        card.ready.set(true);
        card.asgi.set(true);
        card.streams.set(1000);
        let board = Scoreboard::default();
        board.add(0, card.clone());
        assert_eq!(board.seats(32), [0, 32], "idle streams are not busy");
        card.admitted.set(3);
        assert_eq!(board.seats(32), [3, 29]);
        card.admitted.set(32);
        assert_eq!(board.seats(32), [32, 0], "every admission taken: busy");
    }

    #[test]
    fn an_asgi_workers_admitted_requests_are_its_running_ones_until_their_answers_start() {
        let card = Card::new(1, Phase::Serve);
        card.ready.set(true);
        card.admit(7, "GET /slow HTTP/1.1".into());
        card.admit(8, "GET /sse HTTP/1.1".into());
        assert_eq!((card.state(), card.admitted.get(), card.served.get()), (WorkerState::Busy, 2, 2));
        assert_eq!(&*card.longest_request().unwrap().0, "GET /slow HTTP/1.1");
        card.started(7);
        card.started(7);
        assert_eq!(card.admitted.get(), 1);
        assert_eq!(&*card.longest_request().unwrap().0, "GET /sse HTTP/1.1");
        card.started(8);
        assert_eq!((card.state(), card.longest_request()), (WorkerState::Idle, None));
    }

    #[test]
    fn a_loop_is_as_late_as_its_last_beat_or_its_silence_past_a_beat() {
        let card = Card::new(1, Phase::Serve);
        assert_eq!(card.loop_lag(Instant::now()), None, "no heartbeat: a WSGI worker");
        let beat = Rc::new(Cell::new(LoopBeat { beats: 0, lag: Duration::ZERO }));
        let read = beat.clone();
        *card.loop_beat.borrow_mut() = Some(Box::new(move || read.get()));
        let start = Instant::now();
        assert_eq!(card.loop_lag(start), None, "no beat yet");
        beat.set(LoopBeat { beats: 1, lag: Duration::from_millis(7) });
        assert_eq!(card.loop_lag(start), Some(Duration::from_millis(7)));
        let later = start + LOOP_BEAT + Duration::from_millis(30);
        assert_eq!(card.loop_lag(later), Some(Duration::from_millis(30)), "silent a beat and 30 ms more");
        beat.set(LoopBeat { beats: 2, lag: Duration::from_millis(31) });
        assert_eq!(card.loop_lag(later), Some(Duration::from_millis(31)));
        assert_eq!(card.loop_lag(later + Duration::from_millis(50)), Some(Duration::from_millis(31)));
    }

    #[test]
    fn the_order_of_all_matches_the_discriminants() {
        for (index, state) in WorkerState::ALL.iter().enumerate() {
            assert_eq!(*state as usize, index);
        }
        for (index, reason) in ExitReason::ALL.iter().enumerate() {
            assert_eq!(*reason as usize, index);
        }
    }

    #[test]
    fn exits_are_counted_by_reason_and_kept_for_a_minute() {
        let board = Scoreboard::default();
        board.exited(ExitReason::Timeout);
        board.exited(ExitReason::MaxRequests);
        board.exited(ExitReason::MaxRequests);
        assert_eq!(board.exits()[ExitReason::MaxRequests as usize], 2);
        assert_eq!(board.recent_exits(ExitReason::is_recycling), 2);
        assert_eq!(board.recent_exits(ExitReason::is_failure), 1);
    }
}
