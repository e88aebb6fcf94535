//! `--user` and `--group`: once the lobby has bound its listen sockets and opened its logs, it
//! gives up root for good. The zygote, forked before, has already done the same in Python
//! (python/maitred/privileges.py), so the workers it forks never run as root.

use std::io;
use std::path::PathBuf;

use maitred_sys::ids;

use crate::config::Credentials;

/// Why the lobby could not become `Credentials`.
#[derive(Debug)]
pub enum DropError {
    /// A file the lobby must still reach as the new user (a Unix socket, a log).
    Chown(PathBuf, io::Error),
    SetGroups(io::Error),
    SetGid(io::Error),
    SetUid(io::Error),
    /// After the switch, the process could become root again: the switch did not take.
    Regained,
}

impl std::fmt::Display for DropError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DropError::Chown(path, e) => write!(f, "cannot give {} to --user: {e}", path.display()),
            DropError::SetGroups(e) => write!(f, "cannot set the supplementary groups: {e}"),
            DropError::SetGid(e) => write!(f, "cannot switch to --group: {e}"),
            DropError::SetUid(e) => write!(f, "cannot switch to --user: {e}"),
            DropError::Regained => f.write_str("after switching to --user the process could become root again"),
        }
    }
}

/// Hands `paths` to the new user (so that it can reopen its logs on SIGUSR1 and clients of its
/// Unix sockets see it as their owner, as gunicorn does), then drops the supplementary groups,
/// the group and the user, in that order (each needs the privilege the next one removes), and
/// checks that root cannot be regained. Nothing to do when the process already is that user
/// and group: a new zygote or a binary upgrade started by a lobby that has switched already.
pub fn drop_to(credentials: &Credentials, paths: &[PathBuf]) -> Result<(), DropError> {
    if already(credentials) {
        return Ok(());
    }
    for path in paths {
        std::os::unix::fs::chown(path, Some(credentials.uid), Some(credentials.gid))
            .map_err(|e| DropError::Chown(path.clone(), e))?;
    }
    ids::set_groups(&credentials.groups).map_err(DropError::SetGroups)?;
    // glibc applies these to every thread of the process.
    ids::set_gid(credentials.gid).map_err(DropError::SetGid)?;
    ids::set_uid(credentials.uid).map_err(DropError::SetUid)?;
    if credentials.uid != 0 && ids::regains_root() {
        return Err(DropError::Regained);
    }
    if !already(credentials) {
        return Err(DropError::Regained);
    }
    Ok(())
}

/// Whether the real, effective and saved ids and the supplementary groups are already these.
fn already(credentials: &Credentials) -> bool {
    let ids_are_these =
        ids::current().is_some_and(|(uids, gids)| uids == [credentials.uid; 3] && gids == [credentials.gid; 3]);
    ids_are_these && {
        let mut wanted = credentials.groups.clone();
        wanted.sort_unstable();
        wanted.dedup();
        ids::groups().is_ok_and(|mut groups| {
            groups.sort_unstable();
            groups.dedup();
            groups == wanted
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_identity_needs_no_switch() {
        let (uid, gid) = ids::real();
        let current = Credentials { uid, gid, groups: ids::groups().unwrap() };
        // Runs as root or not: becoming who one already is changes nothing and needs no right.
        assert!(drop_to(&current, &[PathBuf::from("/nonexistent/never-chowned")]).is_ok());
    }
}
