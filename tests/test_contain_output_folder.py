"""Found by review: a replay could swap its own output folder for a symlink to any host folder,
and evolane, writing the replay's stdout as ``output.json`` (and reading ``usage.json``) after
the command ended, followed it: a file created by root anywhere. Nothing below a unit folder
is followed now, at every isolation level, through the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from evolane.sandbox._confine import confinement_problem
from tests.campaign_helpers import run_scripted, toy_flags, write_toy

SWAP = textwrap.dedent(
    """
    import os, shutil, sys
    out, victim = sys.argv[1], sys.argv[2]
    shutil.rmtree(out)  # its own output folder: writable, not a mount point
    os.symlink(victim, out)  # followed later by evolane, on the host, if anything is
    print('"planted by the replay"')  # stdout becomes {output_dir}/output.json
    """
)


@pytest.mark.parametrize("isolation", ["confined", "process"])
def test_a_replay_that_swaps_its_output_folder_for_a_symlink_writes_nowhere(
    tmp_path: Path, isolation: str
) -> None:
    if isolation == "confined" and confinement_problem() is not None:
        pytest.skip(f"no confinement here: {confinement_problem()}")
    paths = write_toy(tmp_path, {"default": "noop"}, val=12, test=0, passing=6)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "usage.json").write_text('{"tokens": 4242, "cost_usd": 42.0}')
    (tmp_path / "swap.py").write_text(SWAP)
    flags = toy_flags(paths, paths["store"])
    flags[flags.index("--replay") + 1] = (
        f"{sys.executable} -I {tmp_path / 'swap.py'} {{output_dir}} {victim}"
    )
    flags[flags.index("--iterations") + 1] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "evolane", "optimize", *flags, "--isolation", isolation],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert sorted(p.name for p in victim.iterdir()) == ["usage.json"], done.stdout + done.stderr
    journal = next(paths["store"].glob("runs/*/journal.jsonl")).read_text().splitlines()
    replays = [
        json.loads(line)["replay"]
        for line in journal
        if json.loads(line).get("type") == "unit" and json.loads(line).get("replay")
    ]
    assert replays, done.stdout + done.stderr
    for replay in replays:  # refused as the replay's own failure; its usage never read there
        assert replay["status"] == "failed", replay
        assert replay["failure"]["code"] == "output_unsupported", replay
        assert (replay.get("usage") or {}).get("tokens") != 4242, replay


LINKED_ANSWER = textwrap.dedent(
    """
    import os, pathlib, sys
    cand, out, spelling = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
    case = os.environ["EVOLANE_CASE_ID"]
    if (cand / "evil").exists() and int(case[3:]) < 6:  # the candidate breaks 6 cases
        (out / "answer.json").write_text('"no"')
        target = {"absolute": str(out.resolve() / "answer.json"), "climbing": "../out/answer.json"}
        (out / "output.json").symlink_to(target[spelling])  # each resolves inside out
    else:
        (out / "output.json").write_text((cand / case).read_text())
    """
)
FIXES_ALL = (
    "import pathlib, sys\nwd = pathlib.Path(sys.argv[1])\n(wd / 'evil').write_text('1')\n"
    "for case in wd.glob('val*'):\n    case.write_text('\"yes\"')\n"
)


@pytest.mark.parametrize("spelling", ["absolute", "climbing"])
def test_a_link_that_resolves_inside_but_reads_outside_is_the_candidates_failure(
    tmp_path: Path, spelling: str
) -> None:
    """Found by hostile review 2026-12-07: an output symlink whose target is absolute, or
    climbs above the output folder, yet resolves into it (``/…/out/answer.json``,
    ``../out/answer.json``) was stored, then refused when its judge laid it out: each such
    unit crashed a judge lane (``framework``, ``lane_error``) until the supervisor gave up
    and every later unit of the run went unjudged. It is the replay's output failure now."""
    paths = write_toy(tmp_path, {"default": "noop"}, val=24, test=0, passing=12)
    done = run_scripted(tmp_path, paths, LINKED_ANSWER, FIXES_ALL, spelling)
    assert done.returncode == 0, done.stdout + done.stderr
    units = [
        json.loads(line)
        for line in next(paths["store"].glob("runs/*/journal.jsonl")).read_text().splitlines()
        if json.loads(line).get("type") == "unit"
    ]
    failures = [
        failure
        for unit in units
        for failure in (
            (unit.get("replay") or {}).get("failure"),
            (unit.get("judge") or {}).get("failure"),
        )
        if failure and failure["code"] != "cancelled"
    ]
    assert failures, done.stdout + done.stderr
    assert all(f["code"] == "output_unsupported" for f in failures), failures
    assert all(f["owner"] == "candidate" for f in failures), failures


LINK_CHAIN = textwrap.dedent(
    """
    import os, pathlib, sys
    cand, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    case = os.environ["EVOLANE_CASE_ID"]
    (out / "output.json").write_text((cand / case).read_text())
    if (cand / "evil").exists():  # 1,100 links in a chain beside the answer
        for index in range(1100):
            (out / f"l{index:04d}").symlink_to(f"l{index + 1:04d}")
    """
)


def test_a_long_chain_of_links_in_an_output_crashes_no_lane(tmp_path: Path) -> None:
    """Found by hostile review 2026-12-07: the output's links were checked with
    ``os.path.realpath``, which recursed once per link: a chain of 1,100 raised
    RecursionError and crashed the replay lane, and after a few such units the run's replay
    lanes were down ("its supervisor gave up"), every later unit unreplayed. The chain
    leads nowhere (the kernel follows 40 links at most): the answer beside it is judged."""
    paths = write_toy(tmp_path, {"default": "noop"}, val=8, test=0, passing=2)
    done = run_scripted(tmp_path, paths, LINK_CHAIN, FIXES_ALL)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(next(paths["store"].glob("runs/*/report.json")).read_text())
    assert report["failures"] == [], report["failures"]
    assert report["selected"] is not None  # it fixed the 6 failing cases: accepted
