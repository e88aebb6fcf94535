//! The server hooks the lobby calls (docs/HOOKS.md): gunicorn's arbiter hooks, Python functions
//! of the config file, run by the interpreter of the `maitred` command that became the lobby.
//!
//! None runs on the event loop. One thread of their own runs them one after the other, in the
//! order they were asked for, so a slow hook holds up only the hooks after it, never a request.
//! Where the lobby must wait for one (when_ready before it accepts, on_reload before the new
//! workers start), it goes on serving meanwhile and hears of the end as an event.

use std::io;
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// A hook the lobby calls, with its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LobbyHook {
    /// Every worker has loaded the application; the lobby accepts once it has run.
    WhenReady,
    /// SIGHUP: the config file has been read again; the new workers start once it has run.
    OnReload,
    /// SIGUSR2: a new maitred is being started.
    PreExec,
    /// The number of workers the lobby keeps has changed (SIGTTIN, SIGTTOU), or a reload read it.
    WorkersChanged { new: usize, old: usize },
    /// A worker has exited: its pid, its age (its slot + 1) and the pid of the zygote that
    /// forked it.
    ChildExit { pid: i32, age: usize, zygote: i32 },
}

/// The hook raised an exception; its traceback is in the error log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HookFailed;

/// Runs one lobby hook (the CLI's Python), on the hook thread.
pub type HookCaller = Arc<dyn Fn(&LobbyHook) -> Result<(), HookFailed> + Send + Sync>;

/// The config file's hooks, as far as the lobby is concerned.
pub struct ServerHooks {
    pub call: HookCaller,
    /// worker_int is set: SIGQUIT sent to the lobby goes on to every worker.
    pub interrupt_workers: bool,
    /// worker_abort is set: a worker past --timeout gets SIGABRT before it is killed.
    pub abort_on_timeout: bool,
}

type Reply = Box<dyn FnOnce(Result<(), HookFailed>) + Send>;

/// The thread that runs the lobby's hooks.
pub(crate) struct HookThread {
    jobs: mpsc::Sender<(LobbyHook, Option<Reply>)>,
    finished: mpsc::Receiver<()>,
}

impl HookThread {
    pub fn start(call: HookCaller) -> io::Result<HookThread> {
        let (jobs, queue) = mpsc::channel::<(LobbyHook, Option<Reply>)>();
        let (done, finished) = mpsc::channel();
        std::thread::Builder::new().name("hooks".into()).spawn(move || {
            crate::log::block_terminal_signals();
            for (hook, reply) in queue {
                let result = call(&hook);
                if let Some(reply) = reply {
                    reply(result);
                }
            }
            let _ = done.send(());
        })?;
        Ok(HookThread { jobs, finished })
    }

    /// Queues `hook`; never waits.
    pub fn call(&self, hook: LobbyHook) {
        // The thread only ends once this sender is dropped.
        let _ = self.jobs.send((hook, None));
    }

    /// Queues `hook`, and `reply` with its result once it has run.
    pub fn call_then(&self, hook: LobbyHook, reply: impl FnOnce(Result<(), HookFailed>) + Send + 'static) {
        let _ = self.jobs.send((hook, Some(Box::new(reply))));
    }

    /// Lets the hooks still queued run, for `within` at most; false if they had not finished.
    pub fn finish(self, within: Duration) -> bool {
        drop(self.jobs);
        self.finished.recv_timeout(within).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[test]
    fn runs_hooks_in_order_off_the_callers_thread_and_replies() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = seen.clone();
        let caller = std::thread::current().id();
        let thread = HookThread::start(Arc::new(move |hook: &LobbyHook| {
            assert_ne!(std::thread::current().id(), caller);
            recorded.lock().unwrap().push(hook.clone());
            if *hook == LobbyHook::OnReload {
                Err(HookFailed)
            } else {
                Ok(())
            }
        }))
        .unwrap();
        let (tx, rx) = mpsc::channel();
        thread.call(LobbyHook::WorkersChanged { new: 3, old: 2 });
        thread.call_then(LobbyHook::OnReload, move |result| tx.send(result).unwrap());
        thread.call(LobbyHook::ChildExit { pid: 7, age: 1, zygote: 5 });
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(Err(HookFailed)));
        assert!(thread.finish(Duration::from_secs(5)));
        assert_eq!(
            *seen.lock().unwrap(),
            [
                LobbyHook::WorkersChanged { new: 3, old: 2 },
                LobbyHook::OnReload,
                LobbyHook::ChildExit { pid: 7, age: 1, zygote: 5 }
            ]
        );
    }

    #[test]
    fn finishing_waits_a_bounded_time_for_a_slow_hook() {
        let thread = HookThread::start(Arc::new(|_: &LobbyHook| {
            std::thread::sleep(Duration::from_millis(500));
            Ok(())
        }))
        .unwrap();
        thread.call(LobbyHook::PreExec);
        assert!(!thread.finish(Duration::from_millis(50)));
    }
}
