//! The descriptors request and answer bodies go through: the unlinked temporary files they
//! spill to (a request's, `client/body.rs`; an answer's, `spool.rs`) and the pipe a streamed
//! request body flows through (`client/http1/pump.rs`), closed on a thread of their own. A
//! file's last close (and a truncation) frees its pages, which takes time in proportion to its
//! size: 46-62 ms for a 512 MiB upload's file on ext4 here (`strace -T`, 2026-12-07), and
//! 0.03-0.04 s of CPU per 512 MiB without strace. On the event loop every connection waited
//! meanwhile; the `maitred-closer` thread waits instead.

use std::fs::File;
use std::ops::{Deref, DerefMut};
use std::rc::Rc;
use std::sync::mpsc::{self, Sender};
use std::sync::OnceLock;

use crate::log::{self, debug, Level};

const MIB: f64 = (1 << 20) as f64;

/// A body's file or pipe, whose drop hands it to the closer.
#[derive(Debug)]
pub struct BodyFile(Option<File>);

impl BodyFile {
    /// A new unlinked file in the temporary directory ($TMPDIR, else /tmp).
    pub fn new() -> std::io::Result<BodyFile> {
        tempfile::tempfile().map(|file| BodyFile(Some(file)))
    }

    /// The read end of a streamed body's pipe, for the worker.
    pub fn pipe_end(end: std::os::fd::OwnedFd) -> BodyFile {
        BodyFile(Some(File::from(end)))
    }
}

impl Deref for BodyFile {
    type Target = File;

    fn deref(&self) -> &File {
        self.0.as_ref().expect("only drop takes the file")
    }
}

impl DerefMut for BodyFile {
    fn deref_mut(&mut self) -> &mut File {
        self.0.as_mut().expect("only drop takes the file")
    }
}

impl Drop for BodyFile {
    fn drop(&mut self) {
        if let Some(file) = self.0.take() {
            close_later(file);
        }
    }
}

/// Frees a shared file (an answer's spill file, which its parts on their way to the client
/// share) off the loop when this is its last holder; otherwise the last part frees it.
pub fn close_shared_later(file: Rc<File>) {
    if let Ok(file) = Rc::try_unwrap(file) {
        close_later(file);
    }
}

/// A file for the closer, and whether the lobby's log takes debug lines (the log's threshold
/// is the lobby thread's, and a reload may change it).
struct ToClose {
    file: File,
    debug: bool,
}

/// Hands `file` to the closer; closes it here if the closer could not be started.
fn close_later(file: File) {
    if let Some(closer) = closer() {
        let debug = log::enabled(Level::Debug);
        if let Err(unsent) = closer.send(ToClose { file, debug }) {
            drop(unsent.0);
        }
    }
}

/// The closer's end of its queue, the thread started on first use. None when the thread could
/// not be made (a thread limit): the files are then closed where they are dropped, as before.
fn closer() -> Option<&'static Sender<ToClose>> {
    static CLOSER: OnceLock<Option<Sender<ToClose>>> = OnceLock::new();
    CLOSER
        .get_or_init(|| {
            let (to_closer, files) = mpsc::channel::<ToClose>();
            let started = std::thread::Builder::new().name("maitred-closer".into()).spawn(move || {
                for ToClose { file, debug } in files {
                    let size = debug.then(|| file.metadata().map_or(0, |about| about.len()));
                    drop(file);
                    if let Some(size) = size {
                        log::set_level(Level::Debug);
                        debug!("closed a temporary file of {:.1} MiB off the event loop", size as f64 / MIB);
                    }
                }
            });
            started.ok().map(|_| to_closer)
        })
        .as_ref()
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::OwnedFd;
    use std::rc::Rc;

    use super::{close_shared_later, BodyFile};

    /// A pipe's two ends as Files: reading the first sees the end once the second is closed.
    fn pipe() -> (std::fs::File, std::fs::File) {
        let (read, write) = std::io::pipe().unwrap();
        (OwnedFd::from(read).into(), OwnedFd::from(write).into())
    }

    #[test]
    fn a_dropped_file_is_closed_by_the_closer() {
        // The end of a pipe, wrapped as a spilled body's file is: its reader sees the close.
        let (mut reader, writer) = pipe();
        drop(BodyFile(Some(writer)));
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
    }

    #[test]
    fn a_shared_file_is_closed_by_its_last_holder() {
        let (mut reader, writer) = pipe();
        let writer = Rc::new(writer);
        let part = writer.clone();
        close_shared_later(writer);
        // Still held by a part: nothing closed it.
        (&*part).write_all(b"still open").unwrap();
        close_shared_later(part);
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, b"still open");
    }
}
