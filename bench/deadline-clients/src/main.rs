//! Clients with a deadline, one new TCP connection per request, for scenario O1 (bench/README.md).
//!
//! ```text
//! deadline-clients closed --concurrency 16 --seconds 3 http://127.0.0.1:P/
//! deadline-clients open --rate 800 --seconds 15 http://127.0.0.1:P/
//! ```
//!
//! closed: --concurrency clients, each sending its next request as soon as its last one is over,
//! for --seconds: the most the server answers this client (O1's capacity).
//! open: requests arrive at --rate per second for --seconds, each started at its due time whatever
//! the earlier ones are doing (an open loop, as users arriving are), so a slow server faces a
//! growing crowd rather than a client that waits for it.
//!
//! Each request opens its own connection, sends `GET /` with "Connection: close", reads one whole
//! response (its head, then Content-Length bytes of body, or until the close without one) and gives
//! up after --deadline seconds (1 s) from its start, closing its socket, as a user or a proxy with a
//! deadline does. Both modes stop by themselves: the last request starts before --seconds have
//! passed and is over one --deadline later. Then the program prints one line
//! "DEADLINE-CLIENTS-JSON {...}":
//!
//! ```text
//! mode, seconds, deadline_s, rate, concurrency   the command line (rate: null in closed mode)
//! sent            requests started
//! good            answered 200 within the deadline
//! shed            answered 503 within the deadline (the server refused them quickly)
//! other_status    answered with another status within the deadline
//! late            no complete answer within the deadline (given up)
//! refused, reset  the connection was refused, or reset or closed before a complete answer
//! good_rps        good answers per second: open, all of them over --seconds (each request
//!                 started within them); closed, those that arrived within --seconds
//! good_per_second good answers by the second (since the start) in which they arrived
//! good_latency_ms percentiles (50, 90, 99, 99.9) of the good answers' latency, from the request's
//!                 start; good_max_ms, good_mean_ms
//! arrival_rps     requests started per second, first to last (null with fewer than two)
//! lateness_ms     how long after its due time each request started (open; {} when closed): the
//!                 generator's own delay, percentiles and max
//! cpu_percent     this program's CPU time (user and system) over its run, in % of one core
//! wall_s          the run, from the first due time to the end of the last request
//! ```
//!
//! One thread (tokio's current-thread runtime) does it all: at O1's rates the work per request is
//! a few system calls, and one thread keeps the CPU it takes from the server under test small.

mod alarm;
mod cli;
mod clients;
mod report;
mod response;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep_until, Instant};

use cli::{Args, Mode};

/// How far ahead of the first due time the schedule is laid, so that the first arrivals are not
/// already late when the loop starts.
const LEAD: Duration = Duration::from_millis(50);

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.iter().any(|argument| argument == "-h" || argument == "--help") {
        println!("{}", cli::USAGE);
        return ExitCode::SUCCESS;
    }
    let args = match cli::parse(argv) {
        Ok(args) => args,
        Err(error) => return usage_error(&error),
    };
    let target = match cli::target(&args.url) {
        Ok(target) => target,
        Err(error) => return usage_error(&error),
    };
    raise_open_files_limit();
    take_real_time_priority();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .expect("a current-thread runtime builds");
    match runtime.block_on(run(&args, target)) {
        Ok(report) => {
            println!("DEADLINE-CLIENTS-JSON {report}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("deadline-clients: the open loop's timer failed: {error}");
            ExitCode::FAILURE
        }
    }
}

fn usage_error(error: &str) -> ExitCode {
    eprintln!("{}\ndeadline-clients: error: {error}", cli::USAGE);
    ExitCode::from(2)
}

async fn run(args: &Args, target: cli::Target) -> std::io::Result<serde_json::Value> {
    let target = Arc::new(target);
    let deadline = Duration::from_secs_f64(args.deadline);
    let cpu_before = cpu_seconds();
    let began = Instant::now() + LEAD;
    sleep_until(began).await;
    let outcomes = match (args.mode, args.rate) {
        (Mode::Open, Some(rate)) => {
            // Python's round(), half to even, as the generator this one replaces counted.
            let count = (rate * args.seconds).round_ties_even() as u64;
            clients::open(target, deadline, rate, count, began).await?
        }
        _ => {
            let end = began + Duration::from_secs_f64(args.seconds);
            clients::closed(target, deadline, args.concurrency, end).await
        }
    };
    let wall_s = began.elapsed().as_secs_f64();
    let cpu_s = cpu_seconds() - cpu_before;
    Ok(report::report(args, began, &outcomes, wall_s, cpu_s))
}

/// This process's user and system CPU time so far, in seconds.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let seconds = |time: libc::timeval| time.tv_sec as f64 + time.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// Up to --rate x --deadline connections are open at once.
fn raise_open_files_limit() {
    // SAFETY: getrlimit and setrlimit only read and write the struct they are given.
    unsafe {
        let mut limit = std::mem::zeroed::<libc::rlimit>();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// The clients share the machine's cores with the server. At the normal priority they wait for
/// the CPU behind the server's processes and threads, and start requests hundreds of ms late
/// (measured beside granian's and gthread's threads): the server would set the pace of the
/// arrivals. At a real-time priority each request starts at its due time, as it would from
/// clients on machines of their own; the CPU they use is the same, and shown.
fn take_real_time_priority() {
    let parameters = libc::sched_param { sched_priority: 1 };
    // SAFETY: sched_setscheduler only reads the struct it is given; 0 is this thread, the one
    // the current-thread runtime runs on.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_RR, &parameters) } != 0 {
        let error = std::io::Error::last_os_error();
        eprintln!("deadline-clients: no real-time priority ({error}; needs root); requests may start late");
    }
}
