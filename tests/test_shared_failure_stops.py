"""A measurement stopped by the host's failure ends the run ``failed``, never ``finished``.

Found by review: a replay program that vanished mid-run (an agent CLI uninstalled, a venv
rebuilt) or a lost Dask scheduler stopped the measurement as a shared failure with only a
warning; the campaign went on deciding on the pairs it had (or none), ran its finalization
on a cut-short test split and ended ``finished``, the campaign ``complete``, exit 0: the
host's breakage read as a finished search, and ``--resume-campaign`` refused a complete
campaign. Now the run ends ``failed`` (exit 1) naming the measurement and the failure, no
decision is taken on it, and ``--resume-campaign`` continues, reusing what was journaled.

A proposal whose measurement the host stopped in `HOST_FAILED_RUNS` runs is dropped, as
indecisive, by the next: every ``--resume-campaign`` measured it again, for ever.
"""

from __future__ import annotations

import json
from pathlib import Path

from evolane.campaign import HOST_FAILED_RUNS
from tests.campaign_helpers import run_optimize, shared_folder, toy_flags, write_toy

_AGENT = """#!/bin/sh
umask 0
echo x >> {folder}/calls
[ "$(wc -l < {folder}/calls)" -ge {last} ] && rm -f "$0"
cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"
"""
_WORKING = '#!/bin/sh\ncat "$1/$EVOLANE_CASE_ID" > "$2/output.json"\n'


def _report(store: Path, run_id: str) -> dict:
    return json.loads((store / "runs" / run_id / "report.json").read_text())


def _run_id(stdout: str) -> str:
    (line,) = [line for line in stdout.splitlines() if "(run r-" in line]
    return line.split("(run ")[1].split(",")[0]


def _vanishing_agent(tmp_path: Path, plan: dict[str, str]) -> tuple[dict[str, Path], Path, list]:
    """The toy workload (``plan``) replayed by a program that removes itself after its 18th
    replay (12 baseline replays, then the candidate's): its paths, the program, the flags."""
    paths = write_toy(tmp_path, plan)
    folder = shared_folder(tmp_path / "agent")  # the replays run as uids of their own
    agent = folder / "agent.sh"
    agent.write_text(_AGENT.format(folder=folder, last=18))
    agent.chmod(0o755)
    flags = toy_flags(paths, paths["store"])
    flags[flags.index("--replay") + 1] = f"{agent} {{candidate}} {{output_dir}}"
    flags += ["--isolation", "process", "--expose-rw", str(folder)]
    return paths, agent, flags


def _mended(agent: Path) -> None:
    agent.write_text(_WORKING)
    agent.chmod(0o755)


def test_a_replay_program_gone_mid_run_fails_the_run_and_the_campaign_continues(
    tmp_path: Path,
) -> None:
    paths, agent, flags = _vanishing_agent(tmp_path, {"default": "fix:8"})

    done = run_optimize(flags)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    first = _report(paths["store"], _run_id(done.stdout))
    assert (first["status"], first["campaign_status"]) == ("failed", "paused")
    assert "measurement c0.i0.s0 stopped: candidate replay could not start" in first["message"]
    assert "the host's failure" in done.stdout
    assert first["selected"] is None  # nothing accepted on pairs the host cut short
    assert all(d["decision"] != "accept" for d in first["decisions"]), first["decisions"]
    assert [m["status"] for m in first["measurements"]] == ["complete", "shared_failure"]
    assert "--resume-campaign" in done.stdout

    _mended(agent)
    again = run_optimize([*flags, "--resume-campaign", first["campaign_id"]])
    assert again.returncode == 0, again.stdout + again.stderr
    second = _report(paths["store"], _run_id(again.stdout))
    assert second["status"] == "finished"
    assert second["selected"] is not None  # the fix is found once the host works
    base = next(m for m in second["measurements"] if m["measurement_id"] == "c0.i0.base")
    assert (base["units_run"], base["units_reused"]) == (0, 12)  # nothing paid twice


def test_a_proposal_the_host_keeps_failing_on_is_dropped_as_indecisive_not_measured_forever(
    tmp_path: Path,
) -> None:
    """Found by review: against a host whose failure stops the measurement of the same
    proposal, every --resume-campaign measured it again and failed again, without bound."""
    paths, agent, flags = _vanishing_agent(tmp_path, {"0.0": "fix:8", "default": "fix:4"})
    done = run_optimize(flags)
    assert done.returncode == 1, done.stdout + done.stderr
    campaign_id = _report(paths["store"], _run_id(done.stdout))["campaign_id"]
    resume = [*flags, "--resume-campaign", campaign_id]
    for _ in range(HOST_FAILED_RUNS - 1):  # the program is still gone: the host fails again
        again = run_optimize(resume)
        assert again.returncode == 1, again.stdout + again.stderr
        report = _report(paths["store"], _run_id(again.stdout))
        assert report["measurements"][-1]["measurement_id"] == "c0.i0.s0"
    assert "the next run drops it unmeasured, as indecisive" in report["message"]

    _mended(agent)  # the host works again; the proposal is dropped all the same
    last = run_optimize(resume)
    assert last.returncode == 0, last.stdout + last.stderr
    assert "Traceback" not in last.stderr
    report = _report(paths["store"], _run_id(last.stdout))
    assert report["status"] == "finished"
    assert "c0.i0.s0" not in {m["measurement_id"] for m in report["measurements"]}
    (dropped,) = [d for d in report["decisions"] if (d["iteration"], d["slot"]) == (0, 0)]
    assert dropped["decision"] == "indecisive"
    assert f"the host's failure in {HOST_FAILED_RUNS} runs" in dropped["reason"]
    assert "slot c0.i0.s0: dropped unmeasured" in last.stdout
    assert report["selected"] is not None  # the campaign went on: slot 1's fix is found
    campaign = json.loads(
        (paths["store"] / "campaigns" / campaign_id / "campaign.json").read_text()
    )
    assert all(edit["slot"] != "c0.i0.s0" for edit in campaign["rejected"])  # not a loss
