"""The `maitred` command.

It reads the settings, prepares the process (directory, environment, error log, pid file),
forks the zygote while the process has a single thread, and then becomes the lobby by calling
into the native module, which returns only when the server has stopped.

Every failure before the server runs is one line, ``maitred: error: <message>``: exit code 2
for a bad command line or config file, 1 for anything else that stops it from starting.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import traceback
from collections.abc import Mapping, Sequence
from typing import NoReturn

from maitred import _native, config, hooks, log, privileges, reload, succession, zygote
from maitred.app import AppLoadError, load_app

EXIT_USAGE = 2
EXIT_STARTUP = 1


class _StartupFailure(Exception):
    """The process could not be prepared; str(error) is one line for the operator."""


def main(argv: Sequence[str] | None = None) -> NoReturn:
    sys.exit(run(sys.argv[1:] if argv is None else argv))


def run(argv: Sequence[str]) -> int:
    # `maitred top` only when "top" comes first and alone: `maitred top:app` and
    # `maitred -w 2 top` still serve an application.
    if argv[:1] == ["top"]:
        return _top(argv[1:])
    started_in = os.getcwd()
    zygote_channel = os.environ.pop(ZYGOTE_VARIABLE, None)
    if zygote_channel is not None:
        return _be_zygote(argv, zygote_channel)
    # Inherited from the maitred this one replaces (SIGUSR2): its watcher is not ours.
    reload.take_report_address(os.environ)
    try:
        inheritance = succession.take_inheritance(os.environ)
        settings = config.resolve(argv, upgrading=inheritance is not None)
        if settings["reload"]:
            reload.check_available()
    except (ValueError, config.UsageError, reload.WatcherMissing) as error:
        _print_error(str(error))
        # --check-config's answer is 0 or 1, as gunicorn's is, whatever is wrong.
        return EXIT_STARTUP if _checking(argv) else EXIT_USAGE
    if settings["print_config"]:
        sys.stdout.write(config.printed(settings))
        return 0
    if settings["check_config"]:
        return _check(settings)
    lobby_hooks = hooks.LobbyHooks(settings)
    # Made before --chdir applies: it reads the command line again for each reload.
    reread = config.rereader(argv, settings, lobby_hooks.adopt)
    try:
        _prepare_process(settings)
    except _StartupFailure as error:
        _print_error(str(error))
        return EXIT_STARTUP
    warnings = settings[config.WARNINGS]
    assert isinstance(warnings, list)
    for warning in warnings:
        log.log("warning", warning)
    notes = settings[config.NOTES]
    assert isinstance(notes, list)
    for note in notes:
        log.log("info", note)
    pid_file = settings["pid"]
    upgrade = {
        "command": succession.command(),
        "directory": started_in,
        "pid_file": pid_file,
        "predecessor": None,
        "inherited": {},
    }
    if inheritance is not None:
        addresses = [*settings["bind"], *([settings["stats"]] if settings["stats"] else [])]
        upgrade["inherited"] = succession.reuse_listeners(addresses, inheritance.listeners)
        upgrade["predecessor"] = inheritance.channel
    try:
        # After an upgrade the lobby writes it once it serves: until then it names the
        # maitred being replaced, which still serves if this one fails to start.
        if isinstance(pid_file, str) and inheritance is None:
            _write_pid_file(pid_file)
        return _serve(settings, reread, upgrade, lobby_hooks)
    except _StartupFailure as error:
        _print_error(str(error))
        return EXIT_STARTUP
    finally:
        if isinstance(pid_file, str):
            _remove_pid_file(pid_file)


# Set by the lobby when it starts a fresh zygote, for a reload with --preload: the descriptor of
# the zygote's end of its control channel. The lobby owns the name.
ZYGOTE_VARIABLE = _native.ZYGOTE_CHANNEL_VARIABLE


def _be_zygote(argv: Sequence[str], channel: str) -> NoReturn:
    """A zygote the lobby started with the command maitred was started with: read the
    settings as maitred did (the config file as it is now), prepare the process the same way,
    and serve the control channel. Failures go to the lobby as the first zygote's do."""
    control = socket.socket(fileno=int(channel))
    try:
        settings = config.resolve(argv)
        _prepare_process(settings)
    except (config.UsageError, _StartupFailure) as error:
        zygote.fail(control, str(error))
        os._exit(EXIT_STARTUP)
    config.without_service_manager(os.environ)
    _become_user(control, settings)
    _run_zygote(control, settings)


def _checking(argv: Sequence[str]) -> bool:
    """Whether --check-config was asked for where a failing resolve can still see it."""
    flag = "--check-config"
    return flag in argv or flag in os.environ.get(config.CMD_ARGS_VARIABLE, "").split()


def _check(settings: Mapping[str, object]) -> int:
    """--check-config: the settings are right (resolve said so); load the application as a
    worker would, in its directory and environment, without binding or forking anything."""
    try:
        wanted = privileges.credentials(settings)
        if wanted is not None:
            privileges.check_possible(wanted)
        _enter_directory_and_environment(settings)
        spec = settings["app"]
        assert isinstance(spec, str)
        load_app(spec)
    except (_StartupFailure, privileges.PrivilegeError, AppLoadError) as error:
        _print_error(str(error))
        return EXIT_STARTUP
    return 0


def _top(argv: Sequence[str]) -> int:
    # Imported here: the server never loads curses.
    from maitred import top

    try:
        return top.run(top.parse_arguments(argv))
    except config.UsageError as error:
        _print_error(str(error))
        return EXIT_USAGE
    except top.CannotShow as error:
        _print_error(str(error))
        return EXIT_STARTUP


def _print_error(message: str) -> None:
    sys.stderr.write(f"maitred: error: {message}\n")
    sys.stderr.flush()


def _prepare_process(settings: Mapping[str, object]) -> None:
    wanted = privileges.credentials(settings)
    if wanted is not None:
        try:
            privileges.check_possible(wanted)
        except privileges.PrivilegeError as error:
            raise _StartupFailure(str(error)) from None
    mask = settings["umask"]
    if isinstance(mask, int):
        # Before anything is created: the lobby's sockets and logs, and the zygote and the
        # workers, which inherit it.
        os.umask(mask)
    _enter_directory_and_environment(settings)
    _open_error_log(settings)


def _enter_directory_and_environment(settings: Mapping[str, object]) -> None:
    directory = settings["chdir"]
    if isinstance(directory, str):
        try:
            os.chdir(directory)
        except OSError as error:
            raise _StartupFailure(f"cannot change to directory {directory}: {error.strerror}")
    environment = settings["env"]
    assert isinstance(environment, list)
    for pair in environment:
        key, _, value = pair.partition("=")
        os.environ[key] = value


def _open_error_log(settings: Mapping[str, object]) -> None:
    error_log = settings["error_logfile"]
    if error_log != "-":
        assert isinstance(error_log, str)
        # On file descriptor 2 it is inherited by the zygote and the workers, and the lobby
        # writes there too: one file holds the whole server's log.
        try:
            fd = os.open(error_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise _StartupFailure(f"cannot open error log {error_log}: {error.strerror}")
        os.dup2(fd, 2)
        os.close(fd)
        log.set_file(error_log)
    level = settings["log_level"]
    assert isinstance(level, str)
    log.configure(level)


def _write_pid_file(path: str) -> None:
    try:
        with open(path, "w") as file:
            file.write(f"{os.getpid()}\n")
    except OSError as error:
        raise _StartupFailure(f"cannot write pid file {path}: {error.strerror}")


def _remove_pid_file(path: str) -> None:
    """Removes the pid file if it is still ours (another instance may have taken it over)."""
    try:
        with open(path) as file:
            if file.read().strip() != str(os.getpid()):
                return
        os.unlink(path)
    except OSError:
        pass  # already gone, or unreadable: nothing of ours left to remove


def _serve(
    settings: Mapping[str, object],
    reread: config.Reread | None,
    upgrade: dict[str, object],
    lobby_hooks: hooks.LobbyHooks,
) -> int:
    # Before the zygote is forked, as gunicorn calls them before it forks workers: what they
    # set up in this process, the zygote and the workers inherit.
    workers = settings["workers"]
    assert isinstance(workers, int)
    if not lobby_hooks.nworkers_changed(workers, None):
        raise _StartupFailure(hooks.summary("nworkers_changed"))
    if not lobby_hooks.on_starting():
        raise _StartupFailure(hooks.summary("on_starting"))
    lobby_end, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    report_address = None
    if settings["reload"]:
        report_address = reload.new_report_address()
        # In the environment, so that every zygote has it: the first, forked below, and those
        # a reload with --preload starts from the command.
        os.environ[reload.REPORT_VARIABLE] = report_address
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        zygote_pid = os.fork()
    except OSError as error:
        raise _StartupFailure(f"cannot fork the zygote: {error.strerror}") from None
    if zygote_pid == 0:
        lobby_end.close()
        _close_inherited_listeners(settings)
        config.without_service_manager(os.environ)
        _become_user(zygote_end, settings)
        _run_zygote(zygote_end, settings)
    zygote_end.close()
    watcher = None
    if report_address is not None:
        extra_files = settings["reload_extra_files"]
        assert isinstance(extra_files, list)
        # A renewed certificate is taken by the same SIGHUP as changed code (docs/TLS.md).
        tls_files = [settings[name] for name in ("certfile", "keyfile", "ca_certs") if settings[name] is not None]
        extra_files = [*extra_files, *tls_files]
        # Started after the fork: the zygote is forked from a process with a single thread.
        watcher = reload.Watcher(report_address, extra_files)
        watcher.start()
    # Hooks come from a config file; without one the lobby has none to call.
    called = lobby_hooks if settings["config"] is not None else None
    try:
        # The lobby takes ownership of the control channel's descriptor.
        return _native.serve(config.lobby_settings(settings), lobby_end.detach(), zygote_pid, upgrade, reread, called)
    except _native.StartupError as error:
        raise _StartupFailure(str(error)) from None
    finally:
        if watcher is not None:
            watcher.stop()
        lobby_hooks.on_exit()


def _become_user(control: socket.socket, settings: Mapping[str, object]) -> None:
    """In the zygote, before it imports anything of the application: --user and --group. A
    failure goes to the lobby, which reports it and stops, as for a zygote that cannot load
    the application."""
    wanted = privileges.credentials(settings)
    if wanted is None:
        return
    try:
        privileges.drop_to(wanted)
    except privileges.PrivilegeError as error:
        zygote.fail(control, str(error))
        os._exit(EXIT_STARTUP)


def _close_inherited_listeners(settings: Mapping[str, object]) -> None:
    """In the zygote: listening sockets handed to maitred (fd://N) belong to the lobby. A
    worker holding one would keep it open, and clients queueing on it, after the lobby has
    gone."""
    binds = settings["bind"]
    assert isinstance(binds, list)
    for bind in binds:
        if bind.startswith("fd://"):
            os.close(int(bind[len("fd://") :]))


def _run_zygote(control: socket.socket, settings: Mapping[str, object]) -> NoReturn:
    code = 1
    try:
        spec = settings["app"]
        assert isinstance(spec, str)
        code = zygote.run(control, settings, functools.partial(load_app, spec))
    except BaseException:  # noqa: BLE001 - the zygote logs why it died, whatever it was
        log.log("critical", f"zygote crashed:\n{traceback.format_exc().rstrip()}")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
