"""`--user`, `--group`, `--initgroups`: who maitred's processes run as.

The lobby switches in Rust (crates/lobby/src/process/privileges.rs) once its listen sockets are bound;
the zygote switches here, right after it is forked and before it imports anything of the
application, so no worker ever runs as root. Both drop the supplementary groups, the group and
the user, in that order, and check that root cannot be regained.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass


class PrivilegeError(Exception):
    """The switch failed; str(error) is one line for the operator."""


@dataclass(frozen=True)
class Credentials:
    uid: int
    gid: int
    groups: tuple[int, ...]
    """The whole supplementary group list after the switch."""

    def as_lobby_setting(self) -> tuple[int, int, list[int]]:
        """The form maitred._native.serve takes as its "drop_to" setting."""
        return (self.uid, self.gid, list(self.groups))


def credentials(settings: Mapping[str, object]) -> Credentials | None:
    """Who --user, --group and --initgroups say to become; None when neither is given.
    (config.resolve has made --group the user's primary group when only --user is given.)"""
    user, group = settings["user"], settings["group"]
    if user is None and group is None:
        return None
    uid = os.getuid() if user is None else user
    assert isinstance(uid, int) and isinstance(group, int)
    groups: tuple[int, ...] = (group,)
    if settings["initgroups"] and user is not None:
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            pass  # a user that no database knows is in no group but --group
        else:
            groups = tuple(sorted(set(os.getgrouplist(name, group))))
    return Credentials(uid, group, groups)


def is_current(wanted: Credentials) -> bool:
    """Whether this process already runs as `wanted` (real, effective and saved ids, and the
    supplementary groups): a zygote or a binary upgrade started by a lobby that has switched."""
    return (
        os.getresuid() == (wanted.uid,) * 3
        and os.getresgid() == (wanted.gid,) * 3
        and sorted(set(os.getgroups())) == sorted(set(wanted.groups))
    )


def check_possible(wanted: Credentials) -> None:
    """Raises PrivilegeError, before anything starts, when the switch would fail for want of
    root."""
    if not is_current(wanted) and os.geteuid() != 0:
        raise PrivilegeError(
            f"--user/--group: switching to uid {wanted.uid}, gid {wanted.gid} needs maitred to be started as root"
        )


def drop_to(wanted: Credentials) -> None:
    """Becomes `wanted` for good. Raises PrivilegeError."""
    if is_current(wanted):
        return
    try:
        os.setgroups(list(wanted.groups))
        os.setresgid(wanted.gid, wanted.gid, wanted.gid)
        os.setresuid(wanted.uid, wanted.uid, wanted.uid)
    except OSError as error:
        raise PrivilegeError(f"cannot switch to uid {wanted.uid}, gid {wanted.gid}: {error.strerror}") from None
    if wanted.uid != 0:
        try:
            os.setuid(0)
        except PermissionError:
            pass  # as it must be
        else:
            raise PrivilegeError(f"after switching to uid {wanted.uid} the process could become root again")
    if not is_current(wanted):
        raise PrivilegeError(f"the switch to uid {wanted.uid}, gid {wanted.gid} did not take")
