"""The files beside an inbox file (`-wal`, `-shm`) and the locks on it: how a process tells
that the file it has open is no longer the one at the path, and what it may then still do.

SQLite keeps each commit in the `-wal` file until a checkpoint copies it into the inbox file;
the `-shm` file is the index every process reads the log through and takes turns with. A
clean-up script that deletes the two under a live process splits the inbox in two. The
process goes on committing to its log, now unlinked, that no one else can read; a process
started afterwards makes a new log and index beside the inbox file and never sees those
commits (nor the ones made before the deletion and not yet checkpointed: a lease, a done
event); and when the first process closes its connection, SQLite checkpoints its orphaned
log over the inbox file and then deletes whatever is at `X-wal` *by name*: the other
processes' new log, with everything committed to it since. An acknowledged event is gone
and `integrity_check` says ok.

What onwatch does about it (docs/rules.md#many-processes-one-file):

- `Guard`: every connection records which inbox file, `-wal` and `-shm` it uses (device and
  inode: the file is held open, so the numbers cannot be given to a new file) and looks
  again after every write and before every answer given without one (a duplicate, a lease
  renewal), and on every poll of `file_replaced()`. The look is one non-blocking read of a
  notification queue for the folder on Linux (three `stat` calls only once something in
  the folder touched one of the three names); three `stat` calls elsewhere.
- A connection whose files are no longer the ones at the path (an orphan) stops: nothing is
  written or read through it again, and it is never closed, since SQLite's close is what
  would checkpoint the orphaned log over newer commits and unlink the others' log. It is
  kept until the process ends (`keep_forever`), when the operating system lets go of it
  without any of that.
- `recover`: first, where that is provably safe, the orphan's log is copied into the inbox
  file at once, so that nothing it committed is lost: when no other process has the inbox
  open (an exclusive lock on SQLite's lock bytes of the file can be had) and none opened it
  since the deletion (there is no `-wal` or `-shm` at the path: SQLite makes them at every
  connection's first read, and while the orphan held its shared lock no other connection
  could have ended and removed its own).
- `unsafe_to_open`: a process about to open the inbox while another process holds it open
  without a `-wal` or `-shm` at the path (a connection orphaned that has not noticed yet,
  or could not recover) waits for that to clear, and otherwise refuses: opening would make
  a new log beside the file and split the inbox as above.
"""

from __future__ import annotations

import array
import ctypes
import errno
import fcntl
import os
import shutil
import struct
import sys
import termios
import threading
from typing import Any

from ..errors import StorageFull

try:  # Linux only; elsewhere every look is three stat calls
    from inotify_simple import INotify, flags, parse_events
except ImportError:  # pragma: no cover - other platforms
    INotify = None
    flags = None
    parse_events = None

SIDES = ("-wal", "-shm")
# SQLite's lock bytes in the inbox file (os_unix.c): every connection in WAL mode holds a
# shared (read) lock on the SHARED range for as long as it is open; an exclusive (write)
# lock on it means no other process has the file open.
PENDING_BYTE = 0x40000000
SHARED_FIRST = PENDING_BYTE + 2
SHARED_SIZE = 510

Identity = tuple[int, int]  # (st_dev, st_ino)

# A write SQLite could not make for want of room: its own code for it (SQLITE_FULL), or an
# I/O error on a file system with less than ROOM bytes left. (Growing the `-shm` index on a
# full disk fails as an I/O error: SQLite reports the failure, not its cause.)
SQLITE_FULL, SQLITE_IOERR = 13, 10
ROOM = 1 << 20


def no_room(exc: BaseException, path: str) -> StorageFull | None:
    """The error to raise for `exc`, met on the inbox at `path`, if it was for want of room
    on its disk; None if it was not."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    if code not in (SQLITE_FULL, SQLITE_IOERR):
        return None
    try:
        free: int | None = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
    except OSError:
        free = None
    if code == SQLITE_IOERR and (free is None or free >= ROOM):
        return None  # an I/O error of another kind
    left = "" if free is None else f", {free:,} bytes free"
    return StorageFull(
        f"inbox {path}: no room to write on its disk ({exc}{left}); nothing was written, "
        f"try again once space is freed"
    )


def identity(path: str) -> Identity | None:
    """The file at `path` (following symlinks), or None if there is none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


# --- keeping an orphaned connection ----------------------------------------------------------

_KEPT: list[Any] = []


def keep_forever(connection: Any) -> None:
    """Make sure `connection` (a sqlite3.Connection) is never closed nor deallocated, not
    even when the interpreter shuts down (which clears module globals): one reference more
    that nothing ever gives back. Its files are let go by the operating system at exit."""
    _KEPT.append(connection)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(connection))


# --- locks -------------------------------------------------------------------------------------

# struct flock as F_GETLK reads it, where we know its layout (64-bit Linux and macOS).
if sys.platform == "linux" and struct.calcsize("P") == 8:
    _FLOCK = "@hhqqi4x"  # l_type, l_whence, l_start, l_len, l_pid

    def _pack(kind: int, start: int, length: int) -> bytes:
        return struct.pack(_FLOCK, kind, os.SEEK_SET, start, length, 0)

    def _unpack(data: bytes) -> tuple[int, int]:
        kind, _, _, _, pid = struct.unpack(_FLOCK, data)
        return kind, pid

elif sys.platform == "darwin":  # pragma: no cover - not where the tests run
    _FLOCK = "@qqihh"  # l_start, l_len, l_pid, l_type, l_whence

    def _pack(kind: int, start: int, length: int) -> bytes:
        return struct.pack(_FLOCK, start, length, 0, kind, os.SEEK_SET)

    def _unpack(data: bytes) -> tuple[int, int]:
        _, _, pid, kind, _ = struct.unpack(_FLOCK, data)
        return kind, pid

else:  # pragma: no cover
    _FLOCK = ""


def lock_holder(fd: int) -> int | None:
    """The pid of another process that holds SQLite's shared or exclusive lock on the inbox
    file open as `fd` (it has the inbox open), or None: nobody else does, or this platform's
    lock record is not one we know how to read. Asks only; takes no lock."""
    if not _FLOCK:  # pragma: no cover
        return None
    try:
        kind, pid = _unpack(
            fcntl.fcntl(fd, fcntl.F_GETLK, _pack(fcntl.F_WRLCK, SHARED_FIRST, SHARED_SIZE))
        )
    except OSError:
        return None
    return None if kind == fcntl.F_UNLCK else pid


def wal_mode(fd: int) -> bool:
    """Whether the file's header says WAL (the read and write versions, bytes 18 and 19)."""
    try:
        return os.pread(fd, 2, 18) == b"\x02\x02"
    except OSError:
        return False


def missing_sides(real: str) -> list[str]:
    return [real + side for side in SIDES if identity(real + side) is None]


def unsafe_to_open(fd: int, real: str) -> str | None:
    """Why opening the inbox file now would split it (see the module's docstring), or None.

    A process that has the inbox open in WAL mode always has its `-wal` and `-shm` beside it
    (a connection makes them at its first read, and only the last one to close removes
    them). So the file in WAL mode, another process holding it open, and either of the two
    missing at the path means they were deleted under that process."""
    if not wal_mode(fd):
        return None
    missing = missing_sides(real)
    if not missing:
        return None
    pid = lock_holder(fd)
    if pid is None:
        return None
    return (
        f"{' and '.join(missing)} {'was' if len(missing) == 1 else 'were'} deleted while "
        f"process {pid} had the inbox open: opening it now would start a second log beside "
        f"the file, without that process's commits. Stop process {pid} (onwatch processes "
        f"notice by themselves, copy what they committed into the file where they safely "
        f"can, and stop), then try again"
    )


def recover(connection: Any, fd: int, real: str, main: Identity) -> str | None:
    """Copy what an orphaned connection's log holds into the inbox file, if that is provably
    safe now; None when done, else why it was not.

    Safe means: the inbox file at the path is still the one the connection uses; no other
    process has it open (the exclusive lock is granted); nobody opened it since the
    deletion (no `-wal` or `-shm` at the path). The lock is then given back entirely, so
    that other processes may open the inbox again at once (the orphan never runs another
    statement). The checkpoint is SQLite's own (TRUNCATE), on the orphan's connection."""
    if identity(real) != main:
        return f"{real} itself is no longer the file this process opened"
    missing = missing_sides(real)
    if len(missing) != len(SIDES):
        return "another process has opened the inbox since (there is a new log beside it)"
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, SHARED_SIZE, SHARED_FIRST, os.SEEK_SET)
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EAGAIN):
            return f"the inbox file cannot be locked ({exc.strerror or exc})"
        pid = lock_holder(fd)
        return f"process {pid if pid is not None else '?'} has the inbox open"
    recovered = False
    try:
        if len(missing_sides(real)) != len(SIDES):  # opened just before we took the lock
            return "another process has opened the inbox since (there is a new log beside it)"
        busy, _, _ = connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            return "SQLite could not finish the checkpoint (a read of this process held it)"
        recovered = True
        return None
    except Exception as exc:  # noqa: BLE001 - the reason goes to the log and the error
        return f"the checkpoint failed ({type(exc).__name__}: {exc})"
    finally:
        # Recovered: let go entirely (the orphan does nothing more). Not: keep the shared
        # lock, as the connection had it, so that no other process's close can think it
        # is the last one.
        release = fcntl.LOCK_UN if recovered else fcntl.LOCK_SH
        fcntl.lockf(fd, release, SHARED_SIZE, SHARED_FIRST, os.SEEK_SET)


# --- the inbox file held open, once per process --------------------------------------------


class Held:
    """The inbox file held open by this process: one descriptor per file, however many
    connections of the process use it, closed with the last of them. (Closing any
    descriptor of a file drops every lock the process holds on it, SQLite's included:
    a second descriptor closed early would take the other connections' locks with it.)"""

    def __init__(self, fd: int, main: Identity, writable: bool) -> None:
        self.fd = fd
        self.main = main
        self.writable = writable
        self.users = 0
        self.guards: list[Guard] = []  # of the connections using it, for the next opener
        # Set once a connection of it was set aside as an orphan: this process may not open
        # the file again (a new connection would share the orphan's index with a new log).
        self.orphaned: str | None = None


_held: dict[Identity, Held] = {}
_held_lock = threading.Lock()


def hold(real: str) -> Held:
    """The held descriptor of the file at `real` (opened now if this process has none);
    OSError if it cannot be opened at all."""
    try:
        fd = os.open(real, os.O_RDWR | os.O_CLOEXEC)
        writable = True
    except PermissionError:
        fd, writable = os.open(real, os.O_RDONLY | os.O_CLOEXEC), False
    except OSError as exc:
        if exc.errno != errno.EROFS:
            raise
        fd, writable = os.open(real, os.O_RDONLY | os.O_CLOEXEC), False
    st = os.fstat(fd)
    main = (st.st_dev, st.st_ino)
    with _held_lock:
        held = _held.get(main)
        if held is None:
            held = _held[main] = Held(fd, main, writable)
            fd = -1
        held.users += 1
    if fd != -1:
        os.close(fd)  # (opened while this process held it already: no lock of ours on it yet)
    return held


def let_go(held: Held, guard: "Guard | None", orphaned: bool) -> None:
    """A connection of `held` closed (or was set aside as an orphan): the descriptor is
    closed once no connection of the process uses the file, except after an orphan, whose
    descriptor stays with it (its locks are part of what keeps it harmless)."""
    with _held_lock:
        if guard is not None and guard in held.guards:
            held.guards.remove(guard)
        if orphaned:
            held.orphaned = (guard and guard.why) or "a connection of this process lost its files"
        held.users -= 1
        if held.users > 0 or held.orphaned or _held.get(held.main) is not held:
            return
        del _held[held.main]
    os.close(held.fd)


# --- watching the folder -------------------------------------------------------------------


class _Folder:
    """One notification queue per folder per process, read without blocking: how many
    times each name in it was created, deleted or moved, since the queue was made.

    Looking costs one ioctl (how many bytes are queued: none, nearly always) and no lock;
    `version` moves whenever something was read, so a guard compares its names' counts
    only then."""

    def __init__(self, notifier: Any) -> None:
        self.notifier = notifier
        self.fd = notifier.fileno()
        self.touched: dict[str, int] = {}
        self.everything = 0  # the queue overflowed or the folder went away: assume all
        self.version = 0
        self.users = 0
        self.lock = threading.Lock()
        self._size = array.array("i", [0])  # FIONREAD's answer (written under the lock)

    def look(self) -> int:
        """Read what is queued, if anything; return `version`. Under the lock: a look from
        another thread meanwhile waits until what was read is counted."""
        size = self._size
        with self.lock:
            try:
                fcntl.ioctl(self.fd, termios.FIONREAD, size, True)
                data = os.read(self.fd, 65536) if size[0] else b""
            except (BlockingIOError, InterruptedError):
                data = b""
            except OSError:
                self.everything += 1
                self.version += 1
                return self.version
            if data:
                for event in parse_events(data):
                    if event.mask & (
                        flags.Q_OVERFLOW | flags.IGNORED | flags.DELETE_SELF | flags.MOVE_SELF
                    ):
                        self.everything += 1  # events lost, or the folder itself moved
                    else:
                        self.touched[event.name] = self.touched.get(event.name, 0) + 1
                self.version += 1
            return self.version


_folders: dict[str, _Folder] = {}
_folders_lock = threading.Lock()


def _watch(folder: str) -> _Folder | None:
    if INotify is None or os.environ.get("ONWATCH_NO_NOTIFY", "") not in ("", "0"):
        return None
    with _folders_lock:
        found = _folders.get(folder)
        if found is None:
            try:
                notifier = INotify(nonblocking=True)
            except OSError:
                return None
            try:
                notifier.add_watch(
                    folder,
                    flags.CREATE
                    | flags.DELETE
                    | flags.MOVED_FROM
                    | flags.MOVED_TO
                    | flags.DELETE_SELF
                    | flags.MOVE_SELF,
                )
            except OSError:
                notifier.close()
                return None
            found = _folders[folder] = _Folder(notifier)
        found.users += 1
        return found


def _unwatch(folder: str, watch: _Folder) -> None:
    with _folders_lock:
        watch.users -= 1
        if watch.users > 0 or _folders.get(folder) is not watch:
            return
        del _folders[folder]
    watch.notifier.close()


class Guard:
    """Whether the inbox file, `-wal` and `-shm` at the path are still the ones a connection
    uses. Made once the connection has opened them (its first read); `lost()` may be
    called from any thread."""

    def __init__(self, path: str, real: str, main: Identity, sides: bool = True) -> None:
        self.path = path  # as given: a symlink retargeted is a replaced file
        self.real = real  # resolved: where SQLite keeps the log and the index
        self.main = main
        self.why: str | None = None
        folder = os.path.dirname(real)
        self._folder = folder
        self._names = tuple(os.path.basename(real) + s for s in ("", *SIDES))
        # The queue first, then what it is compared with: a change in between is seen.
        self._watch = _watch(folder)
        self._version = -1 if self._watch is None else self._watch.look()
        self._seen = self._counts()
        # None: this connection uses no log (a read-only snapshot, see core/sqlite/db.py).
        self.sides: tuple[Identity | None, ...] | None = None
        if sides:
            self.sides = tuple(identity(real + s) for s in SIDES)
            gone = [real + s for s, had in zip(SIDES, self.sides, strict=True) if had is None]
            if gone:  # the connection has just read through them: deleted since
                self.why = f"{' and '.join(gone)} disappeared as the inbox was being opened"

    def _counts(self) -> tuple[int, ...]:
        watch = self._watch
        if watch is None:
            return ()
        return (watch.everything, *(watch.touched.get(name, 0) for name in self._names))

    def lost(self) -> str | None:
        """Why the path no longer names the files this connection uses, or None."""
        if self.why is not None:
            return self.why
        watch = self._watch
        if watch is not None:
            version = watch.look()
            if version == self._version:
                return None  # nothing happened in the folder: no stat needed
            self._version = version
            counts = self._counts()
            if counts == self._seen:
                return None  # nothing happened to any of the three names
            self._seen = counts
        why = self._look()
        if why is not None:
            self.why = why
        return why

    def _look(self) -> str | None:
        try:
            current = os.stat(self.path)
        except FileNotFoundError:
            return f"{self.path} was deleted after it was opened"
        except OSError as exc:
            return f"{self.path} cannot be checked: {exc.strerror or exc}"
        if (current.st_dev, current.st_ino) != self.main:
            return f"{self.path} was replaced by another file after it was opened"
        if current.st_nlink == 0:  # pragma: no cover - a stat of a path finds a link
            return f"{self.path} was deleted after it was opened"
        if self.sides is None:
            return None
        for side, had in zip(SIDES, self.sides, strict=True):
            now = identity(self.real + side)
            if now != had:
                done = "deleted" if now is None else "replaced"
                return f"{self.real}{side} was {done} while this process had the inbox open"
        return None

    def close(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            _unwatch(self._folder, watch)
