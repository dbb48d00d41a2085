"""The sandbox: every subprocess runs here, and a deadline always means the whole tree is gone.

Own session and process group, an allowlisted environment, rlimits and cgroups applied by
a spawn server's clone (a launcher chain where no server works; never ``preexec_fn``),
bounded output capture, a kill ladder that also finds escapees, and a lifeline process that
kills every tree if the runtime itself dies.
"""

from typing import TYPE_CHECKING

from evolane._lazy import lazy_exports

if TYPE_CHECKING:
    from evolane.sandbox._cgroups import process_headroom
    from evolane.sandbox._confine import (
        confinement_fix,
        folders_to_expose,
        interpreter_folders,
        interpreter_prefixes,
        outermost,
        program_folders,
        resolve_isolation,
        template_paths,
        trees_own_process_limit,
        user_counts_step,
        within,
    )
    from evolane.sandbox._env import child_lease
    from evolane.sandbox._host import SandboxHost, open_sandbox, sweep_stale_leases
    from evolane.sandbox._inline import (
        INLINE_BYTES,
        INLINE_FILES,
        INLINE_FOLDER_BYTES,
        INLINE_WORK,
        InlineGate,
    )
    from evolane.sandbox._launch import NAMESPACE_EXTRA_PROCESSES
    from evolane.sandbox._lifeline import LEASE_FILES, LEASE_VARIABLE, lease_holders, lease_matches
    from evolane.sandbox._netns import own_network_problem
    from evolane.sandbox._secrets import commands_run_unprivileged, trees_run_as_unit_uids
    from evolane.sandbox._spec import (
        ENV_NAME_PATTERN,
        MAX_HIDDEN,
        EnvName,
        Isolation,
        Limits,
        OutputCaps,
        Overlay,
        ProcessOutcome,
        SandboxSpec,
        Status,
        StreamCapture,
        View,
    )
    from evolane.sandbox._stop import Stop, UnitStop, cut_by
    from evolane.sandbox._ucounts import evolane_reserve, user_process_cap
    from evolane.sandbox._workspace import WorkspaceError, materialize_workspace

__all__ = [
    "ENV_NAME_PATTERN",
    "INLINE_BYTES",
    "INLINE_FILES",
    "INLINE_FOLDER_BYTES",
    "INLINE_WORK",
    "LEASE_FILES",
    "LEASE_VARIABLE",
    "MAX_HIDDEN",
    "NAMESPACE_EXTRA_PROCESSES",
    "EnvName",
    "InlineGate",
    "Isolation",
    "Limits",
    "OutputCaps",
    "Overlay",
    "ProcessOutcome",
    "SandboxHost",
    "SandboxSpec",
    "Status",
    "Stop",
    "StreamCapture",
    "UnitStop",
    "View",
    "WorkspaceError",
    "child_lease",
    "commands_run_unprivileged",
    "confinement_fix",
    "cut_by",
    "evolane_reserve",
    "folders_to_expose",
    "interpreter_folders",
    "interpreter_prefixes",
    "lease_holders",
    "lease_matches",
    "materialize_workspace",
    "open_sandbox",
    "outermost",
    "own_network_problem",
    "process_headroom",
    "program_folders",
    "resolve_isolation",
    "sweep_stale_leases",
    "template_paths",
    "trees_own_process_limit",
    "trees_run_as_unit_uids",
    "user_counts_step",
    "user_process_cap",
    "within",
]

__getattr__ = lazy_exports(__name__)
