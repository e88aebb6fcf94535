//! The process's user, group and supplementary groups, set for every thread at once.
//!
//! These are libc's calls, not rustix's: glibc applies a set*id call to every thread of the
//! process, where the system call alone (what rustix makes) changes only the calling thread.

use std::io;

/// The real, effective and saved user ids, and the same for the group, if the kernel says.
pub fn current() -> Option<([u32; 3], [u32; 3])> {
    let (mut ruid, mut euid, mut suid) = (0, 0, 0);
    let (mut rgid, mut egid, mut sgid) = (0, 0, 0);
    // SAFETY: each pointer is to a local that outlives the call.
    let known = unsafe {
        libc::getresuid(&mut ruid, &mut euid, &mut suid) == 0 && libc::getresgid(&mut rgid, &mut egid, &mut sgid) == 0
    };
    known.then_some(([ruid, euid, suid], [rgid, egid, sgid]))
}

/// The supplementary groups.
pub fn groups() -> io::Result<Vec<u32>> {
    let mut groups = vec![0; 64];
    loop {
        // SAFETY: `groups` has room for `groups.len()` entries, which getgroups writes at most.
        let count = unsafe { libc::getgroups(groups.len() as libc::c_int, groups.as_mut_ptr()) };
        if count >= 0 {
            groups.truncate(count as usize);
            return Ok(groups);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINVAL) {
            return Err(e);
        }
        // More groups than room: ask again with room for them all.
        groups.resize(groups.len() * 4, 0);
    }
}

/// Sets the supplementary groups.
pub fn set_groups(groups: &[u32]) -> io::Result<()> {
    // SAFETY: the pointer and length describe `groups`, which outlives the call.
    match unsafe { libc::setgroups(groups.len(), groups.as_ptr()) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Sets the real, effective and saved group ids.
pub fn set_gid(gid: u32) -> io::Result<()> {
    // SAFETY: a plain system call on integers.
    match unsafe { libc::setresgid(gid, gid, gid) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Sets the real, effective and saved user ids.
pub fn set_uid(uid: u32) -> io::Result<()> {
    // SAFETY: a plain system call on integers.
    match unsafe { libc::setresuid(uid, uid, uid) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Tries to become root again: true if it worked, which after dropping privileges means a real
/// or saved id of 0 survived.
pub fn regains_root() -> bool {
    // SAFETY: a plain system call on an integer.
    unsafe { libc::setuid(0) == 0 }
}

/// The real user and group ids.
pub fn real() -> (u32, u32) {
    (rustix::process::getuid().as_raw(), rustix::process::getgid().as_raw())
}
