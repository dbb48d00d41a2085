"""What a run's commands can reach, checked before anything is written (issue 17, DESIGN §5).

The level a request gets on this host (`sandbox.resolve_isolation`), said in the live view
and the report; ``--isolation confined`` refused where bubblewrap cannot work; an ``auto``
that had to fall back warned about loudly; exposed paths and the paths a template names
checked against what no command may see (the store, the target, the dataset); a dataset
or trajectory file inside the target refused (`check_inputs_outside_target`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from evolane.campaign._config import CampaignConfig
from evolane.distributed import parse_cluster
from evolane.inputs import Dataset, InputError, llm_model
from evolane.lanes import optimizer_command, plugin_spec
from evolane.measure import split_grant
from evolane.sandbox import (
    NAMESPACE_EXTRA_PROCESSES,
    confinement_fix,
    evolane_reserve,
    own_network_problem,
    process_headroom,
    resolve_isolation,
    template_paths,
    trees_own_process_limit,
    user_process_cap,
    within,
)


@dataclass(frozen=True)
class Containment:
    """The level in force (``confined``, ``namespace``, ``process``), how the report says
    it, and the warning when it is weaker than asked."""

    level: str
    description: str
    warning: str | None


def containment(config: CampaignConfig) -> Containment:
    """The containment ``config``'s commands get here; `InputError` when it cannot be had
    or a path given would show a command what it may never see."""
    check_inputs_outside_target(config)
    commands = config.run_commands
    level, problem = resolve_isolation(commands.isolation)
    if problem is not None and commands.isolation != "auto":
        raise InputError(f"--isolation {commands.isolation}: {problem}")
    for flag, grants in (("--expose", commands.expose), ("--expose-rw", commands.expose_rw)):
        for grant in grants:  # named as given: ROLE=PATH says whose it is
            inside = _hidden_holding(split_grant(grant)[1], commands.hidden)
            if inside is not None:
                raise InputError(f"{flag} {grant}: inside {inside}, which no command may see")
    if level == "confined":
        _check_templates(config)
        _check_links(commands.expose_rw, commands.hidden)
    warning = None
    if problem is not None:
        warning = (
            f"commands are NOT confined ({problem}): they run with {level} isolation and can "
            f"read the host's files; {confinement_fix()}, or pass --isolation process to accept"
        )
    if level == "confined" and (commands.network or commands.network_for):
        warning = network_warning()
    network = "network" if commands.network else "no network"
    roles = tuple(dict.fromkeys((*commands.network_for, *commands.host_network_for)))
    if roles and not commands.network:  # e.g. "network: optimizer"
        network = "network: " + ", ".join(roles)
    if commands.host_network_for:  # e.g. "network: replay [host's network: replay]"
        network += " [host's network: " + ", ".join(commands.host_network_for) + "]"
    description = f"{level} ({network})" if level != "process" else "process"
    return Containment(level, description, warning)


def network_warning() -> str | None:
    """The warning where a confined command given the network must share the host's network
    namespace (no slirp4netns), or None where it gets one of its own."""
    problem = own_network_problem()
    if problem is None:
        return None
    return (
        f"confined commands given the network share the host's ({problem}): they reach its "
        "loopback services, abstract unix sockets and 169.254.169.254; install slirp4netns"
    )


def check_inputs_outside_target(config: CampaignConfig, walked: Sequence[str] = ()) -> None:
    """`InputError` for a ``--dataset`` or ``--from-trajectory`` path that is the target or
    lies inside it (after resolving symlinks and ``..``). The optimizer edits a copy of the
    target and every replay runs one: hiding the dataset's own path hid nothing, they read
    the expected outputs of every split (val and test too) from the copy, and a published
    candidate could rewrite the cases (found by review). Every file of ``walked`` (the
    `trajectory_files` a ``--from-trajectory`` folder's walk reads, before they are read: at
    a resume they may be gone) is checked too: a folder around the target read the
    ``.jsonl`` files inside it, and a symlinked file in a folder elsewhere the file it names
    (found by review)."""
    target = os.path.realpath(config.target)
    inputs = [("--dataset", config.dataset)]
    inputs += [("--from-trajectory", path) for path in config.from_trajectory]
    inputs += [("--from-trajectory", path) for path in walked]
    for flag, path in inputs:
        if path and within(os.path.realpath(path), target):
            raise InputError(
                f"{flag} {path} is inside --target {config.target}: every candidate would "
                "carry the cases and their expected outputs; put it outside the target"
            )


def _check_templates(config: CampaignConfig) -> None:
    """A confined command is never shown the store, target or dataset: a template that
    names a path in them could not run, so it is refused now rather than fail each unit."""
    templates = {
        "--replay": config.measure.replay,
        "--judge": config.measure.judge,
        "--optimizer": optimizer_command(config.propose.optimizer),  # agent:NAME: its CLI
        "--validator": config.validator,
        "--check": config.check,
    }
    for flag, text in templates.items():
        if not text:
            continue
        for path in template_paths([text]):
            inside = _hidden_holding(path, config.run_commands.hidden)
            if inside is not None:
                raise InputError(
                    f"{flag} names {path}, inside {inside}: a confined command never sees "
                    "the store, the target or the dataset (use the placeholders, or copy "
                    "the file elsewhere)"
                )


def _check_links(grants: Iterable[str], hidden: tuple[str, ...]) -> None:
    """`InputError` for an ``--expose-rw`` folder holding a symlink on the way to the store,
    the target or the dataset (the target's own link ``app/current`` too): a mask covers
    where a link leads, never the link, so a command could point it at a folder of its own,
    and evolane would follow it there. Found by hostile review (2026-12-07): an optimizer
    given ``--expose-rw app`` pointed ``app/current`` at a copy of the seed with a file of
    its own and a rewritten protected file, and the run published that copy (``applied``)."""
    for grant in grants:
        top = os.path.realpath(split_grant(grant)[1])
        for name in hidden:
            path = Path(os.path.abspath(name))
            for step in (path, *path.parents):
                if step.is_symlink() and within(os.path.realpath(step.parent), top):
                    raise InputError(
                        f"--expose-rw {grant}: holds the symlink {step} on the way to {name}, "
                        "which a command could point elsewhere; expose a folder beside it"
                    )


def _hidden_holding(path: str, hidden: tuple[str, ...]) -> str | None:
    """The hidden path that ``path`` is or lies inside (after resolving), or None."""
    real = os.path.realpath(path)
    return next((name for name in hidden if within(real, os.path.realpath(name))), None)


LOCAL_WORKER_TASKS = 12
"""Tasks each worker of a ``--cluster local:N`` holds in evolane's room on top: its nanny
and worker processes, their threads, its own spawn server (~10 measured, Dask 2026.8)."""


def _reserve(config: CampaignConfig, left: int) -> int:
    """What the host's room ``left`` keeps for evolane: `evolane.sandbox.evolane_reserve`
    (a quarter, 16 to 64 tasks), and the workers of a
    local Dask cluster (found by review: started after the share was taken, 12 of them took
    the reserve, and a candidate's fork bomb in each replay lane then stopped the run)."""
    cluster = parse_cluster(config.measure.cluster)
    workers = cluster.workers if cluster.kind == "local_dask" else 0
    return evolane_reserve(left) + workers * LOCAL_WORKER_TASKS


def _command_trees(config: CampaignConfig, dataset: Dataset) -> int:
    """The local command trees ``config``'s run on ``dataset`` may hold at once: its replay
    lanes, its judge lanes when they run commands, and a validator or optimizer per slot.
    A judge lane runs one for a judge command and, without ``--judge``, for a case's
    verification command (found by review: those were not counted, and a candidate's
    answer that such a command ran forked in every judge lane past the host's room, which
    stopped the run); a model or plugin judge runs none."""
    measure, judge = config.measure, config.measure.judge
    if judge:
        judging = llm_model(judge) is None and plugin_spec(judge, "judge") is None
    else:
        judging = any(
            b"verification_command" in row and "verification_command" in orjson.loads(row)
            for _, row in dataset.rows()
        )
    trees = measure.replay_concurrency + (measure.judge_concurrency if judging else 0)
    return trees + config.population


Room = tuple[int, str]
"""How many more processes and threads the host leaves evolane, and a line's words for it."""


def share_host_pids(config: CampaignConfig, dataset: Dataset) -> tuple[CampaignConfig, str | None]:
    """``config`` with ``--max-procs`` lowered to each command tree's share of the room the
    host leaves (`_host_room`), when its trees may hold more than that room, and the
    preflight line saying so. A fork past the share then fails in its own tree, the
    tree's failure (a candidate's case scored 0), where past the host's room it was the
    host's, which stops the run: found by review, a candidate's fork bomb stopped it. The
    share is taken anew at each start (run.json keeps the flag as given)."""
    room = _host_room(config)
    if config.commands.max_procs is None or room is None:
        return config, None  # no room to share: the cases are not read for their commands
    return _share(config, _command_trees(config, dataset), room)


def _host_room(config: CampaignConfig) -> Room | None:
    """The smaller room for ``config``'s command trees: what the pids cgroups enclosing
    evolane leave (`process_headroom`), and under a non-root evolane's finite ``ulimit -u``
    what its user has left, where each tree's own RLIMIT_NPROC takes its share of it
    (`evolane.sandbox.trees_own_process_limit`; found by review: the trees shared that
    room, and while a candidate's fork bomb held it an honest command's forks failed, its
    case scored 0). None: neither limits them."""
    rooms: list[Room] = []
    headroom = process_headroom()
    if headroom is not None:
        left, cgroup = headroom
        rooms.append((left, f"the host allows {left} more processes ({cgroup}/pids.max)"))
    user = user_process_cap()
    level = resolve_isolation(config.run_commands.isolation)[0]
    if user is not None and user.cap is not None and trees_own_process_limit(level):
        left = user.soft - user.used
        said = f"evolane's user may start {left} more processes and threads (ulimit -u {user.soft})"
        rooms.append((left, said))
    return min(rooms, default=None)


def alone_share(config: CampaignConfig) -> CampaignConfig:
    """``config`` for a command that runs alone, once every lane is done (the post-publish
    check): ``--max-procs`` as given, or the share of one tree of the room left now. Found
    by review: it kept the lanes' share (27 of 512 under a pids.max of 200, for 5 trees),
    and a check that needed 40 processes rolled an honest publish back."""
    asked = config.commands.max_procs_asked
    if asked is not None:
        config = config.model_copy(update={"max_procs": asked, "max_procs_asked": None})
    return _share(config, 1, _host_room(config))[0]


def _share(
    config: CampaignConfig, trees: int, room: Room | None
) -> tuple[CampaignConfig, str | None]:
    """`share_host_pids` for ``trees`` command trees at once, in ``room`` (`_host_room`)."""
    per_tree = config.commands.max_procs
    if per_tree is None or room is None:  # none: every process the host leaves, as asked
        return config, None
    left, where = room
    reserve, extra = _reserve(config, left), NAMESPACE_EXTRA_PROCESSES + _slirp_processes(config)
    share = (left - reserve) // trees - extra
    if trees * (per_tree + extra) <= left - reserve or share < 1:
        return config, None  # room for every tree, or none to share (`host_warnings`)
    commands = config.commands.model_copy(update={"max_procs": share, "max_procs_asked": per_tree})
    said = (
        f"--max-procs {per_tree} lowered to {share} a command tree: {where} for {trees} "
        "trees at once, so a tree forking past its share fails on its own limit and the run "
        "goes on"
    )
    return config.model_copy(update={"commands": commands}), said


def user_process_line(config: CampaignConfig, dataset: Dataset) -> str | None:
    """The preflight line under a non-root evolane's finite ``ulimit -u``: each command's
    RLIMIT_NPROC keeps evolane's reserve (`evolane.sandbox.user_process_cap`; found by
    review: a candidate's fork bomb took the user's every process, evolane could start no
    thread more, and the run stopped as the host's failure). ``config`` is the one
    `share_host_pids` gave: each confined tree's own limit is its ``--max-procs`` (or
    share) with its launcher's processes; other trees share the room when their
    ``--max-procs`` may hold more than it (said so; none where it may not)."""
    user = user_process_cap()
    if user is None or user.cap is None:
        return None  # no limit, root, or no room to keep (`host_warnings`)
    per_tree, room = config.commands.max_procs, user.cap - user.used
    held = f"ulimit -u {user.soft}, {user.used} in use, {user.soft - user.cap} kept for evolane"
    level = resolve_isolation(config.run_commands.isolation)[0]
    if per_tree is not None and trees_own_process_limit(level):
        own = min(per_tree + NAMESPACE_EXTRA_PROCESSES + _slirp_processes(config), user.cap)
        return (
            f"each command tree may hold {own} processes and threads of its own, counted in "
            f"its own user namespace, below the {user.cap} evolane's user's commands may "
            f"hold ({held}): a fork bomb fails in its own tree, and the others' forks go on"
        )
    if per_tree is not None and _command_trees(config, dataset) * per_tree <= room:
        return None
    return (
        f"commands fork only while evolane's user holds fewer than {user.cap} processes and "
        f"threads ({held}): a fork bomb fails on that limit and the run goes on, but while "
        "one holds it other commands' forks fail too"
    )


def _slirp_processes(config: CampaignConfig) -> int:
    """1 where a confined command given the network gets a namespace of its own here: its
    slirp4netns sits in its tree's cgroups beside ``--max-procs`` (found by review: left
    out of the share, each networked tree took one process of evolane's reserve)."""
    commands = config.run_commands
    if not (commands.network or set(commands.network_for) - set(commands.host_network_for)):
        return 0
    if resolve_isolation(commands.isolation)[0] != "confined":
        return 0
    return int(own_network_problem() is None)


def host_warnings(config: CampaignConfig, dataset: Dataset) -> list[str]:
    """A warning when the pids cgroups enclosing evolane allow fewer processes than its command
    trees may hold at once (each up to ``--max-procs``; any number with none): a fork
    refused there below the tree's own limit fails inside a replay, tried again and then
    stopping the run as the host's failure (`evolane.lanes.HOST_REFUSED`; with none, the
    tree's failure), and evolane's own threads compete for the same slots. Found by review:
    it said the tree's failure, while a candidate's fork bomb so stopped the run. And one
    when a non-root evolane's ``ulimit -u`` leaves too few to keep evolane a reserve."""
    user = user_process_cap()
    said = []
    if user is not None and user.cap is None:
        said.append(
            f"evolane's user may start {user.soft - user.used} more processes and threads "
            f"(its ulimit -u is {user.soft}): too few to keep any for evolane, so a command "
            "may take them all and stop the run; raise ulimit -u"
        )
    return said + _pid_room_warnings(config, dataset)


def _pid_room_warnings(config: CampaignConfig, dataset: Dataset) -> list[str]:
    """`host_warnings`' of the pids cgroups enclosing evolane."""
    per_tree = config.commands.max_procs
    headroom = process_headroom()
    if headroom is None:
        return []
    left, cgroup = headroom
    if per_tree is None:  # one tree may take every process the host leaves (found by review)
        return [
            f"the host allows {left} more processes ({cgroup}/pids.max) and --max-procs is "
            "off: one command tree may take them all, and a process the host refuses fails "
            "inside a replay and counts as its tree's failure; set --max-procs"
        ]
    trees = _command_trees(config, dataset)
    if trees * per_tree <= left:
        return []
    return [
        f"the host allows {left} more processes ({cgroup}/pids.max), fewer than {trees} "
        f"command trees x --max-procs {per_tree}: a fork the host refuses stops the run (a "
        "candidate's fork bomb can); lower --max-procs or the lanes"
    ]
