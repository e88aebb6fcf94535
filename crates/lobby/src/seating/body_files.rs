//! The descriptors request and answer bodies go through: the unlinked temporary files they
//! spill to (a request's, `client/body.rs`; an answer's, `spool.rs`) and the pipe a streamed
//! request body flows through (`client/http1/pump.rs`), written and closed on threads of their
//! own.
//!
//! A file's last close (and a truncation) frees its pages, which takes time in proportion to its
//! size: 46-62 ms for a 512 MiB upload's file on ext4 here (`strace -T`, 2026-12-07), and
//! 0.03-0.04 s of CPU per 512 MiB without strace. On the event loop every connection waited
//! meanwhile; the `maitred-closer` thread waits instead.
//!
//! Writing a spooled request body's file held up the event loop: while four chunked 512 MiB
//! uploads were spooled at once, a small request on another connection waited 14-31 ms at the
//! median, 1.1-1.5 ms with the `maitred-spooler` thread writing instead (docs/LIMITS.md, "A
//! spooled body is written off the event loop"), and a write the kernel holds back for dirty
//! pages no longer stops every connection. The thread writes what each read of a body brought
//! while the loop reads the next (`write_later`).

use std::fs::File;
use std::io::{self, IoSlice, Write};
use std::ops::Deref;
use std::rc::Rc;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, OnceLock};

use bytes::{Buf, Bytes};
use tokio::sync::oneshot;

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

impl Drop for BodyFile {
    fn drop(&mut self) {
        if let Some(file) = self.0.take() {
            close_later(file);
        }
    }
}

/// Pieces of a request body for its file, and where the outcome of writing them goes.
struct ToWrite {
    file: Arc<File>,
    pieces: Vec<Bytes>,
    done: oneshot::Sender<io::Result<()>>,
}

/// Has the spooler thread write `pieces` to the end of `file` (a duplicate of a body file's
/// descriptor: the body's own stays with its connection, which may drop it at any time), in
/// order after what it was given before; the receiver has the outcome. The pieces come back
/// when the thread could not be started (a thread limit), for the caller to write itself.
pub fn write_later(file: &Arc<File>, pieces: Vec<Bytes>) -> Result<oneshot::Receiver<io::Result<()>>, Vec<Bytes>> {
    let Some(spooler) = spooler() else { return Err(pieces) };
    let (done, outcome) = oneshot::channel();
    match spooler.send(ToWrite { file: file.clone(), pieces, done }) {
        Ok(()) => Ok(outcome),
        Err(unsent) => Err(unsent.0.pieces),
    }
}

/// The spooler's end of its queue, the thread started on first use.
fn spooler() -> Option<&'static Sender<ToWrite>> {
    static SPOOLER: OnceLock<Option<Sender<ToWrite>>> = OnceLock::new();
    SPOOLER
        .get_or_init(|| {
            serving_thread("maitred-spooler", |ToWrite { file, mut pieces, done }| {
                // A body whose connection has gone no longer waits: its outcome is dropped.
                let _ = done.send(write_pieces(&file, &mut pieces));
            })
        })
        .as_ref()
}

/// A thread named `name` that hands each item sent to it to `serve`, and the end to send on;
/// None when the thread could not be made (a thread limit).
fn serving_thread<T: Send + 'static>(name: &str, mut serve: impl FnMut(T) + Send + 'static) -> Option<Sender<T>> {
    let (sender, items) = mpsc::channel::<T>();
    let started = std::thread::Builder::new().name(name.into()).spawn(move || items.into_iter().for_each(&mut serve));
    started.ok().map(|_| sender)
}

/// Writes `pieces` to `file` whole, in as few writev(2) calls as the file takes, and empties it.
pub fn write_pieces(mut file: &File, pieces: &mut Vec<Bytes>) -> io::Result<()> {
    let mut first = 0;
    loop {
        // Past the pieces written whole (or empty from the start).
        while first < pieces.len() && pieces[first].is_empty() {
            first += 1;
        }
        if first == pieces.len() {
            break;
        }
        let slices: Vec<IoSlice<'_>> = pieces[first..].iter().map(|piece| IoSlice::new(piece)).collect();
        let mut written = match file.write_vectored(&slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while written > 0 {
            let piece = &mut pieces[first];
            let taken = written.min(piece.len());
            piece.advance(taken);
            written -= taken;
            if piece.is_empty() {
                first += 1;
            }
        }
    }
    pieces.clear();
    Ok(())
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
            serving_thread("maitred-closer", |ToClose { file, debug }| {
                let size = debug.then(|| file.metadata().map_or(0, |about| about.len()));
                drop(file);
                if let Some(size) = size {
                    log::set_level(Level::Debug);
                    debug!("closed a temporary file of {:.1} MiB off the event loop", size as f64 / MIB);
                }
            })
        })
        .as_ref()
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Seek, Write};
    use std::os::fd::OwnedFd;
    use std::rc::Rc;

    use bytes::Bytes;

    use super::{close_shared_later, write_pieces, BodyFile};

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

    #[test]
    fn pieces_reach_the_file_whole_and_in_order_past_one_writev_s_most() {
        // 3,000 pieces, past IOV_MAX (1,024): writev takes them in several calls. Empty ones
        // among them (none ends the write early), and pieces of every size from 0 to 999.
        let pieces: Vec<Bytes> =
            (0..3000u32).map(|i| Bytes::from(vec![(i % 251) as u8; (i as usize * 7) % 1000])).collect();
        let expected: Vec<u8> = pieces.iter().flat_map(|piece| piece.iter().copied()).collect();
        let mut file = tempfile::tempfile().expect("a temporary file");
        let mut unwritten = pieces.clone();
        write_pieces(&file, &mut unwritten).expect("written");
        assert!(unwritten.is_empty());
        let mut written = Vec::new();
        file.rewind().expect("rewound");
        file.read_to_end(&mut written).expect("read back");
        assert_eq!(written, expected);
        // Nothing to write is no call that fails.
        write_pieces(&file, &mut vec![Bytes::new()]).expect("nothing written");
    }
}
