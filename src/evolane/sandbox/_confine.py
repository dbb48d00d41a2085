"""The confined level: every command in a bubblewrap (``bwrap``) view built from an allowlist.

A confined command sees the system folders read-only, the interpreters' prefixes
read-only, what its `View` exposes, its own directories, a fresh ``/proc`` of its own pid
namespace, a private size-capped ``/tmp`` and ``/dev/shm`` (the rest of ``/dev`` read-only),
no network unless the view allows it, and nothing else: the store, the target and the
dataset are masked even when an exposed folder holds them. The mounts are bubblewrap's
(what Flatpak uses), never hand-rolled.

It runs as ``nobody`` (uid 65534) in an unprivileged user namespace with no capability
outside it (``--disable-userns``: no nested namespace gets any either). The namespace maps
that uid to evolane's own: the files the command writes belong to evolane's user, and a
root evolane's commands can read root-owned files they are *shown* (the mount view is
what keeps them in). A real unprivileged host uid would also need every exposed folder
readable by that uid, which ``mkdtemp`` folders (0700) and ``/root`` are not. bwrap makes
that namespace inside another of the command's own, whose limits cap what it takes of
evolane's user's per-user counts (`user_counts_step`, `evolane.sandbox._ucounts`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import sys
from collections.abc import Iterable
from functools import cache, lru_cache
from pathlib import Path, PurePosixPath

from evolane.sandbox._launch import host_tools, namespaces_available
from evolane.sandbox._secrets import probe_succeeds, trees_run_as_unit_uids
from evolane.sandbox._spec import Isolation, IsolationInForce, View
from evolane.sandbox._ucounts import count_caps_argv, user_count_caps

SANDBOX_UID = 65_534
"""The uid (and gid) a confined command has inside its user namespace: ``nobody``."""
SYSTEM_FOLDERS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Shown read-only to every confined command (a top-level symlink such as ``/bin ->
usr/bin`` is recreated as the same symlink)."""
HOST_ONLY = ("/proc", "/sys", "/dev", "/run")
"""Never exposed from the host, nor anything in them, even when a template names a path
there (the command gets its own ``/proc`` and ``/dev``)."""
HOST_SECRETS = (
    "/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers",
    "/etc/sudoers.d", "/etc/ssl/private", "/etc/krb5.keytab", "/etc/security/opasswd",
)  # fmt: skip
"""Covered in every confined view with ``/etc`` whatever their modes, with whatever else
under /etc others may not read (`host_secrets`): a root evolane's confined command reads
what root reads (bwrap maps its uid onto root; found by review: /etc/shadow was readable)."""
PROC_SYS_READ_ONLY = ("--ro-bind", "/proc/sys", "/proc/sys")
"""Covers the fresh ``/proc``'s sysctls read-only. The kernel lets any task whose uid is
root on the host write a global sysctl, capabilities or not, and a root evolane's command
is: bwrap covers ``/proc/sys`` only when it can write the folder itself, which the sysctl
root never allows (found by review: a confined replay wrote ``vm.swappiness`` and could
open ``kernel.core_pattern``, whose ``|program`` the kernel runs as root on the host at the
next core dump; with ``--network``, the host's ``net.*`` too). The host's ``/proc/sys``
shows the same tables: each one a namespace owns (net, ipc, uts, user) is looked up by
the task reading it, not by the mount."""
DEV_READ_ONLY = ("--remount-ro", "/dev")
"""Seals bwrap's own ``/dev`` (an uncapped tmpfs: half the host's memory) once its devices
and a capped ``/dev/shm`` are in: a confined command wrote 600 MiB there, and as much in
``/dev/shm``, beside a ``/tmp`` full at 256 MiB (found by review; with ``--max-memory none``
each command could fill half the host's memory). The devices still read and write."""
PRIVATE = ("/tmp", "/var/tmp")
"""Never exposed as a whole (the command gets its own ``/tmp``); a folder inside may be."""
_PATH_IN_TEXT = re.compile(r"""(?:^|(?<=[\s'"=:,(]))(/[^\s'"`;|&<>()*?$,:=]+)""")


def bwrap_path() -> str | None:
    """The bubblewrap binary, or None."""
    return shutil.which("bwrap", path="/usr/bin:/bin:/usr/local/bin:/usr/sbin")


@cache
def bwrap_wants_privileges() -> bool:
    """Whether a non-root evolane's bwrap is set-uid (a host without unprivileged user
    namespaces): a spawn server's clone may not install the seccomp filter then (the
    no_new_privs it needs would strip bwrap's privileges), so bwrap installs it itself."""
    bwrap = bwrap_path()
    if bwrap is None or os.geteuid() == 0:
        return False
    try:
        return bool(os.stat(bwrap).st_mode & stat.S_ISUID)
    except OSError:
        return False


@cache
def confinement_problem() -> str | None:
    """Why this host cannot confine commands (one line), or None when it can (probed once)."""
    bwrap = bwrap_path()
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed (apt-get install -y bubblewrap)"
    true = shutil.which("true", path="/usr/bin:/bin")
    if true is None:
        return "no 'true' binary to probe bubblewrap with"
    view = View()
    argv = bwrap_argv(view, own=(), workspace=Path("/"))
    if probe_succeeds([*argv, true]):
        return None
    return f"bubblewrap cannot create namespaces on this host ({bwrap} {' '.join(argv[1:4])}...)"


@cache
def user_counts_step() -> tuple[str, ...] | None:
    """The launcher step that caps a confined command's share of evolane's user's counts
    (`evolane.sandbox._ucounts`), or None where it cannot work: no such counts (a kernel
    before 5.11), no ``unshare``, or bwrap fails inside it (a host may forbid the nested
    user namespace). Probed once."""
    tools, caps = host_tools(), user_count_caps()
    true = shutil.which("true", path="/usr/bin:/bin")
    if not caps or tools.unshare is None or tools.sh is None or true is None:
        return None
    if confinement_problem() is not None:
        return None
    step = count_caps_argv(tools.unshare, tools.sh, caps)
    argv = bwrap_argv(View(), own=(), workspace=Path("/"))
    return tuple(step) if probe_succeeds([*step, *argv, true]) else None


def trees_own_process_limit(isolation: str) -> bool:
    """Whether each command tree at ``isolation`` (the level in force) gets an RLIMIT_NPROC
    of its own, which bounds it where no pids cgroup does: a root evolane's ``drop_root``
    command's unit uid's (`trees_run_as_unit_uids`), or, under a non-root evolane, a
    confined tree's, set inside its own user namespace where `user_counts_step` works
    (`evolane.sandbox._ucounts.tree_process_share`)."""
    if trees_run_as_unit_uids(isolation):
        return True
    return isolation == "confined" and os.geteuid() != 0 and user_counts_step() is not None


def confinement_fix() -> str:
    """What makes confinement work here, for advice beside `confinement_problem`: install
    bubblewrap, or, installed, let it create namespaces (it said "install bubblewrap" to a
    host that had it; found by review)."""
    if bwrap_path() is None:
        return "install bubblewrap"
    return "let bubblewrap create namespaces (allow unprivileged user namespaces)"


def template_paths(argv: Iterable[str]) -> list[str]:
    """Absolute paths written literally in a command's words (``python3 /x/judge.py``,
    ``--config=/x/c.toml``, inside ``sh -c '...'``); placeholders must be removed first."""
    found: list[str] = []
    for word in argv:
        found += [match.group(1).rstrip("/.") or "/" for match in _PATH_IN_TEXT.finditer(word)]
    return found


def folders_to_expose(paths: Iterable[str]) -> list[str]:
    """What to show read-only for paths a command names: an existing folder itself; an
    existing file's folder (so its siblings import), but only the file when that folder is
    ``/`` or a home folder; nothing for missing paths or what the system view covers. Each
    is judged by its name and by where it really is (it is bound there): a template naming
    ``/var/run/docker.sock`` showed the host's whole ``/run`` (found by review: its sockets
    connect through a read-only mount, and a root evolane's command is root to them)."""
    shown: list[str] = []
    for text in paths:
        path = Path(text)
        try:
            if not path.exists():
                continue
            folder = path if path.is_dir() else path.parent
            names = (str(folder), os.path.realpath(folder))
        except OSError:
            continue
        if any(map(_too_wide, names)):
            folder = path
            names = (str(path), os.path.realpath(path))
        if _covered(names[0]) or not all(map(_may_show, names)):
            continue
        shown.append(str(folder))
    return sorted(set(shown))


def _may_show(path: str) -> bool:
    """Whether a template may show ``path``: nothing in `HOST_ONLY`, nor a `PRIVATE` folder
    or ``/`` as a whole."""
    return path not in ("/", *PRIVATE) and not any(within(path, top) for top in HOST_ONLY)


def within(path: str, top: str) -> bool:
    """Whether ``path`` is ``top`` or lies inside it, by their names alone (no I/O)."""
    return PurePosixPath(path).is_relative_to(top)


def _covered(path: str) -> bool:
    return any(within(path, top) for top in SYSTEM_FOLDERS)


def interpreter_folders() -> tuple[str, ...]:
    """The running interpreter's prefixes, its installed packages' folders (site-packages,
    an editable install's folder) and the folder evolane is imported from, so a command run
    with evolane's own Python finds its standard library, its packages and evolane. Not
    what only this process was given: a ``PYTHONPATH`` folder, the script's folder or the
    working folder may hold anything (a ``.env``, another dataset; found by review);
    ``--expose`` shows what a command needs besides. Worked out again whenever
    ``sys.path`` changes: a folder taken off it is shown no more."""
    return _interpreter_folders(tuple(sys.path))


def interpreter_prefixes() -> set[str]:
    """The running interpreter's prefixes (a virtual environment's and its base's)."""
    return {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}


@lru_cache(maxsize=8)
def _interpreter_folders(path: tuple[str, ...]) -> tuple[str, ...]:
    """`interpreter_folders` for this ``sys.path``."""
    folders = interpreter_prefixes()
    folders.add(str(Path(__file__).resolve().parents[2]))  # holds evolane/ (an editable src/)
    given = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    given |= {os.getcwd(), os.path.abspath(path[0] or os.getcwd())} if path else set()
    folders |= {
        entry
        for entry in path
        if entry and os.path.abspath(entry) not in given and os.path.isdir(entry)
    }
    real = {os.path.realpath(folder) for folder in folders}
    return tuple(sorted(p for p in folders | real if p != "/" and not _covered(p)))


def outermost(paths: Iterable[str]) -> tuple[str, ...]:
    """``paths`` without those another one of them holds (each bind is a mount to make)."""
    kept: list[str] = []
    for path in sorted({"/" + os.path.abspath(p).lstrip("/") for p in paths}, key=len):
        if not any(within(path, top) for top in kept):
            kept.append(path)
    return tuple(kept)


def _too_wide(name: str) -> bool:
    """Whether ``name`` is ``/``, ``/home``, a home folder or a folder ``/home`` holds:
    never shown for the one file or program a command names."""
    homes = ("/", "/home", str(Path.home()), "/root")
    return name in homes or Path(name).parent == Path("/home")


def _user_data(name: str) -> bool:
    """Whether ``name`` is a hidden folder of a home that is no virtual environment
    (``~/.local``, ``~/.cargo``: a user's data and credentials beside the ``bin`` a
    program is installed in, e.g. ``~/.local/share/*/auth.json``; found by review)."""
    folder = Path(name)
    home = folder.parent
    in_home = str(home) in (str(Path.home()), "/root") or home.parent == Path("/home")
    return in_home and folder.name.startswith(".") and not (folder / "pyvenv.cfg").exists()


def program_folders(program: str) -> list[str]:
    """The prefix of the program a command runs (``/x/venv`` for ``/x/venv/bin/python``)
    and of the file its symlinks resolve to, unless the system view covers them. A prefix
    that is too wide (`_too_wide`: ``~/bin/tool`` showed the whole home, ``~/.ssh`` with
    it; found by review), a home's hidden folder (`_user_data`: ``~/.local/bin/tool``
    showed ``~/.local/share``) or never shown (``/tmp/bin/tool``: the host's ``/tmp``)
    gives way to the program's folder, else the program alone."""
    folders = []
    for path in (Path(program), Path(os.path.realpath(program))):
        prefix = path.parent.parent if path.parent.name == "bin" else path.parent
        for folder in (prefix, path.parent, path):
            names = (str(folder), os.path.realpath(folder))
            wide = any(_too_wide(name) or _user_data(name) for name in names)
            if not wide and all(map(_may_show, names)):
                break
        else:
            continue
        if not _covered(str(folder)):
            folders.append(str(folder))
    return list(dict.fromkeys(folders))


@cache
def _system_args() -> tuple[str, ...]:
    args: list[str] = []
    for top in SYSTEM_FOLDERS:
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    resolv = Path("/etc/resolv.conf")
    if resolv.is_symlink() and not _covered(os.path.realpath(resolv)):
        args += ["--ro-bind-try", os.path.realpath(resolv), os.path.realpath(resolv)]
    return tuple(args)


def _spellings(path: str) -> tuple[str, list[str]]:
    """A path's real location and every name it is shown at: the real one and, when the
    given spelling differs (a symlink, ``..``, ``//``), that one too."""
    real = os.path.realpath(path)
    given = "/" + os.path.abspath(path).lstrip("/")
    return real, list(dict.fromkeys((real, given)))


def _binds(paths: Iterable[str], writable: bool) -> list[str]:
    """Bind each path's real location at each of its names (so either spelling works)."""
    args: list[str] = []
    flag = "--bind-try" if writable else "--ro-bind-try"
    for path in paths:
        real, names = _spellings(path)
        for name in names:
            args += [flag, real, name]
    return args


ETC_WALK_MAX = 50_000
"""Entries of /etc looked at, at most, for what others may not read (`host_secrets`)."""
MAX_SECRETS = 512


@cache
def host_secrets() -> tuple[str, ...]:
    """What the confined view covers under /etc: `HOST_SECRETS`, and every file there that
    others may not read and every folder they may not enter (walked once, iteratively,
    capped): a review found /etc/default/cacerts (0600) readable after the list alone. A
    confined command sees the system as an unprivileged user would."""
    found = {path for path in HOST_SECRETS if os.path.lexists(path)}
    pending, looked = ["/etc"], 0
    while pending and looked < ETC_WALK_MAX and len(found) < MAX_SECRETS:
        with contextlib.suppress(OSError), os.scandir(pending.pop()) as entries:
            for entry in entries:
                looked += 1
                with contextlib.suppress(OSError):
                    mode = entry.stat(follow_symlinks=False).st_mode
                    if stat.S_ISDIR(mode):
                        closed = mode & 0o005 != 0o005  # others may not list or enter it
                        (found.add if closed else pending.append)(entry.path)
                    elif stat.S_ISREG(mode) and not mode & 0o004:
                        found.add(entry.path)
    return tuple(sorted(found)[:MAX_SECRETS])


def _inside(hidden: Iterable[str], own: list[str]) -> list[str]:
    """The ``hidden`` paths that lie strictly inside one of a command's ``own`` paths (by
    real location): covered after the own binds, which would otherwise show them (the
    target's ``.git`` under a post-apply check that is shown the target)."""
    tops = [os.path.realpath(path) for path in own]
    inside = []
    for path in hidden:
        real = os.path.realpath(path)
        if any(within(real, top) and real != top for top in tops):
            inside.append(path)
    return inside


def _masks(hidden: Iterable[str], shown: list[str]) -> tuple[list[str], list[str]]:
    """Cover each hidden path wherever something shown holds it, compared by real location
    and covered under every name the holder is shown at: an empty folder over a folder
    (made read-only by the second list, once the command's own directories inside it are
    mounted), an empty file over a file."""
    args: list[str] = []
    seal: list[str] = []
    holders = [_spellings(top) for top in shown]
    for path in hidden:
        target = os.path.realpath(path)
        if not os.path.lexists(target):
            continue
        for real, names in holders:
            if not within(target, real):
                continue
            rest = os.path.relpath(target, real)
            for name in names:
                cover = name if rest == "." else os.path.join(name, rest)
                if os.path.isdir(target):
                    args += ["--size", str(1 << 20), "--tmpfs", cover]
                    seal.append(cover)
                else:
                    args += ["--ro-bind", "/dev/null", cover]
    return args, [word for cover in dict.fromkeys(seal) for word in ("--remount-ro", cover)]


def _pins(hidden: Iterable[str], read_only: Iterable[str], writable: Iterable[str]) -> list[str]:
    """Bind onto itself each folder between a ``writable`` shown folder and a ``hidden`` path
    inside it (a mount point: it cannot be renamed or removed; writable as the deepest shown
    folder holding it makes it), shallow first. A mask pins only the masked path: found by
    hostile review, a command given ``--expose-rw`` of a folder holding the store two levels
    down renamed the folder between and made its own store in its place, and the root
    evolane wrote the run there."""
    granted = [_spellings(top) for top in writable]
    if not granted:  # no --expose-rw (most runs): nothing a command could move
        return []
    shown = [(os.path.realpath(top), False) for top in read_only]
    shown += [(real, True) for real, _ in granted]
    pins: dict[str, tuple[str, int, bool]] = {}
    for path in hidden:
        target = os.path.realpath(path)
        if not os.path.lexists(target):
            continue
        for real, names in granted:
            if not within(target, real) or target == real:
                continue
            parts = PurePosixPath(os.path.relpath(target, real)).parts[:-1]
            for depth in range(1, len(parts) + 1):
                between = os.path.join(real, *parts[:depth])
                holder = max((s for s in shown if within(between, s[0])), key=lambda s: len(s[0]))
                for name in names:
                    cover = os.path.join(name, *parts[:depth])
                    pins.setdefault(cover, (between, depth, holder[1]))
    ordered = sorted(pins.items(), key=lambda item: item[1][1])
    return [
        word
        for cover, (real, _, rw) in ordered
        for word in ("--bind-try" if rw else "--ro-bind-try", real, cover)
    ]


def bwrap_argv(view: View, *, own: Iterable[tuple[str, bool]], workspace: Path) -> list[str]:
    """The bwrap argv prefix that runs a command confined by ``view``, with ``own`` (path,
    writable) directories shown last and ``workspace`` as its working folder."""
    bwrap = bwrap_path()
    assert bwrap is not None
    args = [bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    args += ["--unshare-user", "--disable-userns", "--uid", str(SANDBOX_UID)]
    args += ["--gid", str(SANDBOX_UID)]
    if not view.network:
        args.append("--unshare-net")
    args += ["--proc", "/proc", *PROC_SYS_READ_ONLY, "--dev", "/dev"]
    for scratch in ("/tmp", "/dev/shm"):  # each capped: the only memory-backed writable places
        args += ["--size", str(view.tmp_bytes), "--tmpfs", scratch]
    args += DEV_READ_ONLY
    args += _system_args()
    shown = [*SYSTEM_FOLDERS, *view.read_only, *view.read_write]
    args += _binds(view.read_only, writable=False)
    args += _binds(view.read_write, writable=True)
    masks, seal = _masks([*view.hidden, *host_secrets()], shown)
    args += [
        *_pins(view.hidden, view.read_only, view.read_write),
        *masks,
    ]  # pins first: a bind after hides no mask
    for path, writable in own:
        args += _binds([path], writable)
    owned = [path for path, _ in own]
    inner, inner_seal = _masks(_inside(view.hidden, owned), owned)
    args += [*inner, *seal, *inner_seal]
    # The root the mounts hang on is bwrap's own tmpfs: read-only, so a command can store
    # nothing outside its own directories and /tmp (whose size is capped).
    args += ["--remount-ro", "/", "--chdir", str(workspace)]
    return [*args, "--"]


def resolve_isolation(requested: Isolation) -> tuple[IsolationInForce, str | None]:
    """The level a request gets on this host, and why it is weaker than asked (None when
    it is not): ``auto`` is confined where bubblewrap works, else namespace, else process."""
    if requested == "process":
        return "process", None
    problem = None
    if requested in ("auto", "confined"):
        problem = confinement_problem()
        if problem is None:
            return "confined", None
        if requested == "confined":
            return "process", problem
    if namespaces_available():
        return "namespace", problem
    return "process", problem or "this host cannot create pid and network namespaces"
