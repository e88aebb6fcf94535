//! One worker, seen from the lobby: its channel (docs/PROTOCOL.md, section 2) and the loop
//! that seats requests at it and relays its answers.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::rc::Rc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use maitred_wire::{FileRange, FrameHeader, Kind, ResponseHead, FLAG_FD, HEADER_LEN};
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;

use crate::health::{self, ProcStat};
use crate::log::{debug, error, warning};
use crate::offer::Offers;
use crate::recycle::Recycle;
use crate::scoreboard::{Card, ExitReason, Phase};
use crate::seating::{Job, JobState, Next};
use crate::spool::{Held, ResponsePart};
use crate::Lobby;

/// A received frame: its header, its payload, and its descriptor if it carried one.
pub struct Frame {
    pub header: FrameHeader,
    pub payload: Bytes,
    pub fd: Option<OwnedFd>,
}

/// The lobby's end of a worker channel.
pub struct Channel {
    socket: AsyncFd<OwnedFd>,
    buf: BytesMut,
    fds: VecDeque<OwnedFd>,
}

impl Channel {
    pub fn new(fd: OwnedFd) -> io::Result<Channel> {
        socket2::SockRef::from(&fd).set_nonblocking(true)?;
        let socket = maitred_sys::reactor::register(fd)?;
        Ok(Channel { socket, buf: BytesMut::new(), fds: VecDeque::new() })
    }

    /// The next whole frame; None at a clean end-of-file between frames.
    pub async fn read_frame(&mut self) -> io::Result<Option<Frame>> {
        loop {
            if self.buf.len() >= HEADER_LEN {
                let mut head = [0u8; HEADER_LEN];
                head.copy_from_slice(&self.buf[..HEADER_LEN]);
                let header = FrameHeader::decode(&head).map_err(invalid)?;
                let total = HEADER_LEN + header.len as usize;
                if self.buf.len() >= total {
                    let mut frame = self.buf.split_to(total);
                    let payload = frame.split_off(HEADER_LEN).freeze();
                    let fd = if header.has_fd() {
                        Some(
                            self.fds
                                .pop_front()
                                .ok_or_else(|| invalid("a frame announced a descriptor that did not come"))?,
                        )
                    } else {
                        None
                    };
                    return Ok(Some(Frame { header, payload, fd }));
                }
                self.buf.reserve(total - self.buf.len());
            } else {
                self.buf.reserve(16 * 1024);
            }
            if self.fill().await? == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the worker closed its channel inside a frame"))
                };
            }
        }
    }

    async fn fill(&mut self) -> io::Result<usize> {
        loop {
            let mut ready = self.socket.readable().await?;
            let room = self.buf.spare_capacity_mut().len();
            let fds_before = self.fds.len();
            let read = ready.try_io(|socket| {
                Ok(maitred_sys::fdpass::recv_into(socket.as_raw_fd(), &mut self.buf, &mut self.fds, 0)?)
            });
            match read {
                Ok(Ok(n)) => {
                    // A Unix stream read stops short only when the socket is empty (or at a
                    // message carrying descriptors). Knowing it is empty saves the read that
                    // would otherwise find out, once per request, when the worker goes idle.
                    if n > 0 && n < room && self.fds.len() == fds_before {
                        ready.clear_ready();
                    }
                    return Ok(n);
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    /// Sends a whole frame, with `fd` attached to its first byte when given.
    pub async fn send(&mut self, frame: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        let mut sent = 0;
        while sent < frame.len() {
            let mut ready = self.socket.writable().await?;
            let bufs = [IoSlice::new(&frame[sent..])];
            let attached = if sent == 0 { fd } else { None };
            let result = ready.try_io(|socket| match attached {
                Some(fd) => Ok(maitred_sys::fdpass::send_with_fd(socket.as_raw_fd(), &bufs, fd.as_raw_fd(), 0)?),
                None => Ok(maitred_sys::fdpass::send(socket.as_raw_fd(), &bufs, 0)?),
            });
            match result {
                Ok(Ok(n)) => sent += n,
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    /// Waits until the worker writes or closes while it should be idle.
    async fn closed_while_idle(&self) -> io::Result<()> {
        if !self.buf.is_empty() {
            return Ok(());
        }
        loop {
            let mut ready = self.socket.readable().await?;
            // Readiness can be stale (left over from the last frame); a peek tells.
            let peeked = ready.try_io(|socket| maitred_sys::socket::peek(socket.as_fd()).map(drop));
            match peeked {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }
}

fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

/// How a worker's time with the lobby ended.
#[derive(Debug)]
pub enum Gone {
    /// The app could not be loaded; the message is one line for the operator.
    BootFailed(String),
    /// Closed by the lobby: when it was recycled (`--max-requests`, `--max-worker-memory`,
    /// `--max-worker-lifetime`), when the supervisor retired it (a reload, SIGTTOU), or at
    /// shutdown.
    Retired,
    /// The process or its channel failed, or the lobby killed it; the detail is for the log.
    Lost(ExitReason, String),
}

/// Waits for the worker's `READY`. Errors say what went wrong, for a start-up failure line.
pub async fn await_ready(channel: &mut Channel) -> Result<(), Gone> {
    match channel.read_frame().await {
        Ok(Some(frame)) if frame.header.kind == Kind::Ready => Ok(()),
        Ok(Some(frame)) if frame.header.kind == Kind::BootFailed => {
            Err(Gone::BootFailed(String::from_utf8_lossy(&frame.payload).trim().to_string()))
        }
        Ok(Some(frame)) => Err(Gone::Lost(ExitReason::Crash, format!("sent {:?} before READY", frame.header.kind))),
        Ok(None) => Err(Gone::Lost(ExitReason::Crash, "exited before it was ready".into())),
        Err(e) => Err(Gone::Lost(ExitReason::Crash, format!("channel failed before READY: {e}"))),
    }
}

/// What the supervisor and a worker's task share.
pub struct Seat {
    /// Its line on the scoreboard, which holds what the supervisor wants of it (its phase).
    pub card: Rc<Card>,
    /// The worker's offer sockets, once it serves.
    offers: RefCell<Option<Rc<Offers>>>,
}

impl Seat {
    pub fn new(card: Rc<Card>) -> Rc<Seat> {
        Rc::new(Seat { card, offers: RefCell::new(None) })
    }

    pub fn phase(&self) -> Phase {
        *self.card.phase.borrow()
    }

    /// Lets a held worker take requests.
    pub fn serve(&self) {
        self.card.phase.send_if_modified(|phase| {
            let held = *phase == Phase::Hold;
            if held {
                *phase = Phase::Serve;
            }
            held
        });
    }

    /// Seats no more requests at the worker. The offers it has not received yet come back,
    /// oldest first, for the caller to queue again; it answers those it has, and the request it
    /// is busy with, then its task ends with `Gone::Retired`.
    pub fn retire(&self) -> Vec<Job> {
        self.card.phase.send_replace(Phase::Retire);
        match &*self.offers.borrow() {
            Some(offers) => offers.recall_until(|_| false),
            None => Vec::new(),
        }
    }
}

/// Seats jobs at this worker until it goes away or is retired. A worker held by `seat` waits,
/// idle, until it may serve.
pub async fn serve(lobby: Rc<Lobby>, pid: i32, mut channel: Channel, mut recycle: Recycle, seat: Rc<Seat>) -> Gone {
    // Made as soon as the worker is ready, held or not: the workers held at the start have all
    // their descriptors open before the server says it serves.
    let offers = match Offers::new() {
        Ok(offers) => Rc::new(offers),
        Err(e) => return Gone::Lost(ExitReason::Crash, format!("could not make its offer sockets: {e}")),
    };
    let frame = FrameHeader { kind: Kind::Offers, flags: FLAG_FD, len: 0 }.encode();
    for receiver in offers.receivers() {
        if let Err(e) = channel.send(&frame, Some(receiver)).await {
            return Gone::Lost(ExitReason::Crash, format!("could not send its offer sockets: {e}"));
        }
    }
    let mut phase = seat.card.phase.subscribe();
    loop {
        match *phase.borrow_and_update() {
            Phase::Serve => break,
            Phase::Retire => return Gone::Retired,
            Phase::Hold => {}
        }
        tokio::select! {
            changed = phase.changed() => if changed.is_err() { return Gone::Retired },
            _ = channel.closed_while_idle() => return Gone::Lost(ExitReason::Crash, idle_loss(&mut channel).await),
        }
    }
    *seat.offers.borrow_mut() = Some(offers.clone());
    lobby.seating.add_offers(offers.clone());
    recycle.begin();
    let gone = seat_jobs(&lobby, pid, &mut channel, &offers, &recycle, &seat.card, &mut phase).await;
    lobby.seating.remove_offers(&offers);
    seat.offers.borrow_mut().take();
    gone
}

async fn seat_jobs(
    lobby: &Rc<Lobby>,
    pid: i32,
    channel: &mut Channel,
    offers: &Offers,
    recycle: &Recycle,
    card: &Card,
    phase: &mut watch::Receiver<Phase>,
) -> Gone {
    // Recycled: it answers what it has taken from its offer socket, and takes nothing more.
    let mut recycled = false;
    let stat = ProcStat::open(pid);
    loop {
        let (job, offered) = match offers.take_accepted() {
            // The worker takes it from its offer socket now that it has finished the last one.
            Some(job) => (job, true),
            None => {
                if recycled || *phase.borrow() == Phase::Retire {
                    return Gone::Retired;
                }
                // Since when the worker has waited for a request, if it has.
                let mut idle_since = None;
                let job = match lobby.seating.next() {
                    Next::Now(job) => job,
                    Next::Later(mut wait) => {
                        idle_since = Some(Instant::now());
                        let lifetime_end = recycle.deadline();
                        tokio::select! {
                            biased;
                            job = &mut wait => match job {
                                Ok(job) => job,
                                Err(_) => return Gone::Retired,
                            },
                            _ = phase.wait_for(|phase| *phase == Phase::Retire) => {
                                wait.close();
                                if let Ok(job) = wait.try_recv() {
                                    lobby.seating.return_unstarted(job);
                                }
                                return Gone::Retired;
                            }
                            // An idle worker past its lifetime retires at once.
                            _ = tokio::time::sleep_until(lifetime_end.unwrap_or_else(tokio::time::Instant::now)),
                                if lifetime_end.is_some() => {
                                wait.close();
                                if let Ok(job) = wait.try_recv() {
                                    lobby.seating.return_unstarted(job);
                                }
                                recycle.check(card.served.get(), false);
                                return Gone::Retired;
                            }
                            _ = channel.closed_while_idle() => {
                                // Take back a job that may have been handed over at the same moment.
                                wait.close();
                                if let Ok(job) = wait.try_recv() {
                                    lobby.seating.return_unstarted(job);
                                }
                                return Gone::Lost(ExitReason::Crash, idle_loss(channel).await);
                            }
                        }
                    }
                };
                if job.state.get() != JobState::Queued {
                    continue;
                }
                // A worker idle for a while may have been stopped meanwhile; one that has just
                // answered was running then, and is not looked at (health::LOOK_AFTER_IDLE).
                // Its first request is looked at whatever the time: the lobby may have read
                // its READY late, from a worker stopped since.
                let look = card.served.get() == 0
                    || idle_since.is_some_and(|since| since.elapsed() >= health::LOOK_AFTER_IDLE);
                if look && stat.is_stopped() {
                    lobby.seating.return_unstarted(job);
                    let bound = lobby.settings().timeout;
                    health::kill_if_still_there(lobby.clone(), pid, stat, bound);
                    return Gone::Lost(
                        ExitReason::Stopped,
                        format!(
                            "it is stopped (SIGSTOP), so no request goes to it; it is killed unless it \
                         exits within {} s (--timeout)",
                            bound.as_secs_f64()
                        ),
                    );
                }
                job.state.set(JobState::Seated);
                let waited = job.enqueued_at.elapsed();
                lobby.metrics.waited(waited);
                debug!("worker {pid} takes {} after {:.1} ms in the queue", job.summary, waited.as_secs_f64() * 1e3);
                if let Err(e) = channel.send(&job.frame, job.body_file.as_ref().map(|file| file.as_fd())).await {
                    lobby.seating.return_unstarted(job);
                    return Gone::Lost(ExitReason::Crash, format!("could not send a request: {e}"));
                }
                (job, false)
            }
        };
        card.begin(job.summary.clone());
        let served = card.served.get();
        // A retiring worker is offered nothing: its offers went back to the queue.
        if *phase.borrow() != Phase::Retire && !recycled {
            offer_queued(lobby, offers, recycle.requests_left(served));
        }
        let relayed = relay_response(lobby, pid, channel, offers, &job, offered).await;
        card.end();
        if let Err(lost) = relayed {
            // What the worker never received goes back to the queue; what it did, it had
            // started when it was lost.
            lobby.seating.requeue_front(offers.recall_until(|_| false));
            while let Some(offered) = offers.take_accepted() {
                fail(&offered, false, 502, "the worker exited while handling this request");
            }
            return match lost {
                Lost::Answered(reason, detail) => Gone::Lost(reason, detail),
                Lost::Unread(why) => {
                    let (reason, why) = match why {
                        Unread::Exited => (ExitReason::Crash, "exited without reading".to_string()),
                        Unread::Wedged => (
                            ExitReason::Wedged,
                            format!(
                            "was killed: alive but wedged (its main thread did not read, in {} s, the request sent \
                             to it idle; another thread holding the GIL does this) before it read",
                            health::READ_WITHIN.as_secs_f64()
                        ),
                        ),
                    };
                    let detail = format!("{why} {}, which goes to another worker", job.summary);
                    // Older than the offers just queued again: it goes in front of them.
                    lobby.seating.return_unstarted(job);
                    Gone::Lost(reason, detail)
                }
            };
        }
        if !recycled && recycle.check(served, true).is_some() {
            recycled = true;
            // The offers it has not received go back to the queue, for the worker that takes
            // its place; those it has, it answers.
            lobby.seating.requeue_front(offers.recall_until(|_| false));
        }
    }
}

/// Offers this (busy) worker the oldest queued jobs, as many as it may hold and, when it is
/// to be retired, no more than the `left` requests it will still take.
fn offer_queued(lobby: &Lobby, offers: &Offers, left: Option<u64>) {
    while !offers.is_full() && left.is_none_or(|left| (offers.len() as u64) < left) {
        let Some(next) = lobby.seating.take_queued() else { return };
        // Its wait ends here: the worker takes it as soon as it has answered.
        let waited = next.enqueued_at.elapsed();
        if let Err(next) = offers.make(next) {
            lobby.seating.return_unstarted(next);
            return;
        }
        lobby.metrics.waited(waited);
    }
}

/// Why an idle worker's channel became readable: it has exited, or it broke the protocol.
async fn idle_loss(channel: &mut Channel) -> String {
    match channel.read_frame().await {
        Ok(None) => "exited while idle".into(),
        Ok(Some(frame)) => format!("sent {:?} while idle", frame.header.kind),
        Err(e) => format!("channel failed while idle: {e}"),
    }
}

/// How a worker was lost during a request.
enum Lost {
    /// The request has been answered (502/504) or cut; why, and the detail for the log.
    Answered(ExitReason, String),
    /// The worker provably never had the whole request, so it never ran: it may run
    /// elsewhere.
    Unread(Unread),
}

/// Why a worker never read a request.
enum Unread {
    /// It exited (after an answer: `SystemExit`, a crash).
    Exited,
    /// It is alive but did not read within `health::READ_WITHIN`, and was killed.
    Wedged,
}

/// Reads the worker's answer to `job` and hands it to the job's connection. If the client
/// goes away meanwhile, the worker is told (`CANCEL`) so it stops producing the answer.
/// Errors mean the worker is lost; the job has been answered (502/504) or cut, or the worker
/// never read it. `offered`: the job went on an offer socket, not on the channel.
async fn relay_response(
    lobby: &Lobby,
    pid: i32,
    channel: &mut Channel,
    offers: &Offers,
    job: &Job,
    offered: bool,
) -> Result<(), Lost> {
    enum Next {
        Frame(io::Result<Option<Frame>>),
        ReadCheck,
        TimedOut,
        ClientGone,
    }
    let timeout = lobby.settings().timeout;
    let seated_at = Instant::now();
    if let Some(served) = &job.served {
        served.seated.set(Some(seated_at));
        served.worker.set(Some(pid));
    }
    let mut deadline = tokio::time::Instant::from_std(seated_at + timeout);
    // A request sent on the channel to an idle worker: if it is still unread after a moment,
    // the worker may be wedged (health::never_read). Offered ones were taken by the worker.
    let mut read_check = (!offered).then(|| tokio::time::Instant::from_std(seated_at + health::READ_WITHIN));
    let mut head_sent = false;
    let mut cancelled = false;
    loop {
        // A slow client's answer past its caps: stop reading from the worker until the client
        // catches up. The time spent so is the client's, not the application's: --timeout
        // does not count it. Said when it starts, since a client that never reads makes it last
        // until --send-timeout.
        if let Some(held) = job.respond.held() {
            let (waiting, cap) = match held {
                Held::AnswerCap => (job.respond.spill_waiting(), "--max-spill"),
                Held::TotalCap => (lobby.spill_budget.waiting(), "--max-spill-total"),
            };
            crate::log::warning_limited!(
                "reading the answer to {} from worker {pid} paused: {waiting} bytes are waiting for slow clients \
                 ({cap}); it goes on as they read",
                job.summary
            );
            let holding_since = tokio::time::Instant::now();
            job.respond.room().await;
            deadline += holding_since.elapsed();
            crate::log::info_limited!(
                "reading the answer to {} from worker {pid} went on after {:.1} s",
                job.summary,
                holding_since.elapsed().as_secs_f64()
            );
        }
        let check_first = read_check.filter(|at| *at < deadline && !head_sent && !cancelled);
        let next = tokio::select! {
            biased;
            read = tokio::time::timeout_at(check_first.unwrap_or(deadline), channel.read_frame()) => match read {
                Ok(read) => Next::Frame(read),
                Err(_) if check_first.is_some() => Next::ReadCheck,
                Err(_) => Next::TimedOut,
            },
            _ = job.respond.closed(), if !cancelled => Next::ClientGone,
        };
        let frame = match next {
            Next::Frame(Ok(Some(frame))) => frame,
            Next::Frame(closed @ (Ok(None) | Err(_))) => {
                // A worker that leaves after an answer (SystemExit, a crash) may do so while the
                // lobby sends it the next request. That request never ran if the worker never
                // had all of it: an offer the lobby can still take back from its socket, or
                // bytes the worker left unread on its channel, which the kernel reports as
                // ECONNRESET when the worker's end closes. Only the request (and a CANCEL for
                // it, hence `cancelled`) is sent on the channel after the last answer's end.
                if !head_sent && !cancelled {
                    let unread = if offered {
                        offers.recall_accepted()
                    } else {
                        matches!(&closed, Err(e) if e.raw_os_error() == Some(libc::ECONNRESET))
                    };
                    if unread {
                        return Err(Lost::Unread(Unread::Exited));
                    }
                }
                return Err(Lost::Answered(
                    ExitReason::Crash,
                    match closed {
                        Ok(_) => fail(job, head_sent, 502, "the worker exited while handling this request"),
                        Err(e) => fail(job, head_sent, 502, &format!("the worker's channel failed: {e}")),
                    },
                ));
            }
            Next::ClientGone => {
                cancelled = true;
                // A CANCEL must not reach the worker after it has moved on to an offered
                // request: it would stop that one. Either all offers come back, and the worker
                // has nothing after this response, or it has received one and is past this one.
                lobby.seating.requeue_front(offers.recall_until(|_| false));
                if !offers.is_empty() {
                    continue;
                }
                debug!("the client of {} went away; telling worker {pid}", job.summary);
                let cancel = FrameHeader { kind: Kind::Cancel, flags: 0, len: 0 }.encode();
                if let Err(e) = channel.send(&cancel, None).await {
                    return Err(Lost::Answered(ExitReason::Crash, format!("could not send CANCEL: {e}")));
                }
                continue;
            }
            Next::ReadCheck => {
                read_check = None;
                if health::never_read(lobby, pid, channel.socket.as_fd()).await {
                    if let Err(e) = lobby.zygotes.kill(pid, libc::SIGKILL).await {
                        error!("could not ask the zygote to kill worker {pid}: {e}");
                    }
                    return Err(Lost::Unread(Unread::Wedged));
                }
                continue;
            }
            Next::TimedOut => {
                // Said before the stack, which the worker writes to the same log
                // (health::dump_stack); the lobby says nothing more until it is written.
                let elapsed = seated_at.elapsed().as_secs_f64();
                let answering = if head_sent { "; the head of its answer had gone out" } else { "" };
                error!(
                    "worker {pid} timed out after {} s on {} (seated {elapsed:.1} s ago{answering}); its Python \
                     stack follows, then it is killed (--timeout)",
                    timeout.as_secs_f64(),
                    job.summary
                );
                health::dump_stack(lobby, pid).await;
                if lobby.abort_on_timeout {
                    health::abort(lobby, pid).await;
                }
                if let Err(e) = lobby.zygotes.kill(pid, libc::SIGKILL).await {
                    error!("could not ask the zygote to kill worker {pid}: {e}");
                }
                let detail = if head_sent {
                    "the application did not finish its response within --timeout"
                } else {
                    "the application did not answer within --timeout"
                };
                return Err(Lost::Answered(ExitReason::Timeout, fail(job, head_sent, 504, detail)));
            }
        };
        let part = match decode_part(frame) {
            Ok(part) => part,
            Err(e) => {
                let _ = lobby.zygotes.kill(pid, libc::SIGKILL).await;
                return Err(Lost::Answered(
                    ExitReason::Crash,
                    fail(job, head_sent, 502, &format!("the worker broke the protocol: {e}")),
                ));
            }
        };
        if matches!(part, ResponsePart::Abort) && !cancelled {
            warning!("the application failed while sending the response to {}; connection cut", job.summary);
        }
        head_sent = true;
        let last = part.is_last();
        if let Some(served) = job.served.as_ref().filter(|_| last) {
            served.answered.set(Some(Instant::now()));
        }
        // A connection that has gone away no longer listens; the worker is still in step.
        if let Err(e) = job.respond.send(part) {
            // The client is cut; dropping its end makes `closed()` tell the worker to stop.
            crate::log::error_limited!("{} cut off: could not spill its answer to a temporary file: {e}", job.summary);
            let _ = job.respond.send(ResponsePart::Abort);
        }
        if last {
            lobby.metrics.served(seated_at.elapsed());
            return Ok(());
        }
    }
}

/// Answers `job` for a lost worker and returns the reason for the log.
fn fail(job: &Job, head_sent: bool, status: u16, detail: &str) -> String {
    if head_sent {
        error!("{} cut off: {detail}", job.summary);
    } else {
        error!("{status} for {}: {detail}", job.summary);
    }
    let part =
        if head_sent { ResponsePart::Abort } else { ResponsePart::Refused { status, detail: detail.to_string() } };
    // Parts without body bytes are never spilled: this send cannot fail.
    let _ = job.respond.send(part);
    detail.to_string()
}

fn decode_part(frame: Frame) -> Result<ResponsePart, String> {
    let end = frame.header.is_end();
    match frame.header.kind {
        Kind::ResponseHead => {
            let (head, body) = ResponseHead::decode_payload(&frame.payload).map_err(|e| e.to_string())?;
            let slice = |s: &[u8]| frame.payload.slice_ref(s);
            Ok(ResponsePart::Head {
                status: head.status,
                reason: slice(head.reason),
                headers: head.headers.iter().map(|(n, v)| (slice(n), slice(v))).collect(),
                body: slice(body),
                end,
            })
        }
        Kind::ResponseBody => Ok(ResponsePart::Body { data: frame.payload, end }),
        Kind::ResponseFile => {
            let range = FileRange::decode_payload(&frame.payload).map_err(|e| e.to_string())?;
            let fd = frame.fd.ok_or("RESPONSE_FILE without a descriptor")?;
            Ok(ResponsePart::File {
                file: Rc::new(File::from(fd)),
                offset: range.offset,
                count: range.count,
                end,
                spilled: false,
            })
        }
        Kind::ResponseAbort => Ok(ResponsePart::Abort),
        other => Err(format!("unexpected {other:?} frame during a response")),
    }
}
