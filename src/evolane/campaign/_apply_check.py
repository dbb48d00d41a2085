"""The post-apply check of a publish (`evolane.campaign._apply`): its sandbox spec, its run
in a workspace of its own, and the one line that says why it failed."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import trio

from evolane.campaign._files import remove_path
from evolane.campaign._vcs import VCS_FOLDERS
from evolane.inputs import CommandTemplate
from evolane.lanes import limit_reason, limits_hit
from evolane.sandbox import Isolation, Limits, ProcessOutcome, SandboxHost, SandboxSpec, View


def check_spec(
    check: CommandTemplate | None,
    target: Path,
    workspace: Path,
    kill_grace: float,
    limits: Limits | None,
    isolation: Isolation,
    view: View | None,
    pass_env: tuple[str, ...] = (),
) -> SandboxSpec | None:
    """The post-publish check's sandbox spec (None: no check): it sees ``view``, its own
    ``workspace`` and ``target`` (what it checks: the published target, or a link target's
    new version folder) read-only, and the variables ``pass_env`` names."""
    if check is None:
        return None
    argv = check.render({"candidate": str(target), "workspace": str(workspace)})
    shown = (view or View()).model_copy(
        update={"own": ((str(workspace), True), (str(target), False))}
    )
    return SandboxSpec(
        argv=argv,
        workspace=str(workspace),
        kill_grace=kill_grace,
        pass_env=pass_env,
        limits=limits or Limits(),
        isolation=isolation,
        view=shown,
        drop_root=True,
        label="apply-check",
    )


def vcs_metadata(target: Path) -> tuple[str, ...]:
    """The version-control metadata at the top of ``target`` (a ``.git`` folder or file...):
    kept from the check as from every optimizer and replay (the seed tree leaves it out),
    while the check is shown the target itself (found by review: a check running the
    published candidate's code read a remote's token in ``.git/config``)."""
    try:
        names = os.listdir(target) if target.is_dir() else []
    except OSError:
        return ()
    return tuple(str(target / name) for name in sorted(names) if name.casefold() in VCS_FOLDERS)


async def run_check(
    host: SandboxHost, spec: SandboxSpec, timeout: float, stash: str | None = None
) -> ProcessOutcome:
    """Run the check in its own workspace (made here, removed after, whatever happens),
    the `vcs_metadata` of what it checks hidden (looked up now: a link target's new version
    folder is built after its spec), and the publish's ``stash`` of originals beside it:
    found by hostile review, a check given ``--expose-rw`` of the target's folder rewrote
    the stashed originals, and the rollback of its own failure put its words in the target."""
    assert spec.workspace is not None
    workspace = Path(spec.workspace)
    await trio.to_thread.run_sync(partial(workspace.mkdir, parents=True))
    checked = [Path(path) for path, writable in spec.view.own if not writable]
    kept = () if stash is None or Path(stash) in checked else (stash,)
    try:
        found = await trio.to_thread.run_sync(lambda: [p for c in checked for p in vcs_metadata(c)])
        view = spec.view.model_copy(update={"hidden": (*spec.view.hidden, *kept, *found)})
        return await host.run(spec.model_copy(update={"view": view}), timeout=timeout)
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(remove_path, workspace)


def check_failure(outcome: ProcessOutcome, timeout: float, limits: Limits) -> str:
    """Why a check that did not pass failed: the limit hit, the exit code or the status,
    with its first line of stderr."""
    stderr = next((line for line in outcome.stderr.text().splitlines() if line.strip()), "")
    detail = f": {stderr.strip()}" if stderr else ""
    hit = limits_hit(outcome, limits)
    if hit:  # the check ran out of room: say which limit and the flag that raises it
        return f"post-apply check stopped: {limit_reason(hit, limits)}{detail}"
    if outcome.status == "exited":
        return f"post-apply check failed with exit code {outcome.exit_code}{detail}"
    if outcome.status == "timed_out":
        return f"post-apply check timed out after {timeout:g}s{detail}"
    why = outcome.error or ", ".join(outcome.limits_hit) or f"signal {outcome.signal}"
    return f"post-apply check {outcome.status.replace('_', ' ')} ({why}){detail}"
