//! Starting a maitred process that talks to this lobby: the fresh zygote of a reload with
//! --preload (`zygote.rs`), and the new maitred of a binary upgrade (`upgrade/`). Each gets one
//! end of a SOCK_SEQPACKET pair, and keeps the descriptors it is given open across exec.

use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::process::Command;

use socket2::{Domain, Socket, Type};

/// A connected SOCK_SEQPACKET pair, both ends close-on-exec.
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let (ours, theirs) = Socket::pair(Domain::UNIX, Type::SEQPACKET, None)?;
    Ok((ours.into(), theirs.into()))
}

/// The command to run `command_line` (program first), whose process keeps `inherited` open
/// across exec: they are close-on-exec here, so that no other child gets them.
pub fn command_keeping(command_line: &[String], inherited: Vec<RawFd>) -> io::Result<Command> {
    let (program, args) =
        command_line.split_first().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no command"))?;
    let mut command = Command::new(program);
    command.args(args);
    maitred_sys::process::keep_across_exec(&mut command, inherited);
    Ok(command)
}
