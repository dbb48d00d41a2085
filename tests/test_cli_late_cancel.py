"""A session cancelled at once (a second Ctrl-C) after its run had ended reports that end.

Found by review (reproduced through the CLI by sending Ctrl-C twice at growing delays after
the final test measurement: about one try in three landed once the report and run.json were
written, while the run drew report.html and closed): the session said "interrupted:
cancelled at once", printed a ``--resume`` that is refused (the run ended ``finished``) and
exited 130. `ended_outcome` gives the session the recorded run's report and exit code.
"""

from __future__ import annotations

import json
from pathlib import Path

from evolane.cli._resumable import ended_outcome
from tests.campaign_helpers import run_optimize, toy_flags, write_toy


def test_a_run_that_ended_keeps_its_report_and_exit_code_when_its_session_is_cancelled(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, {"0.0": "fix:4"})
    store = tmp_path / "store"
    done = run_optimize([*toy_flags(paths, store), "--iterations", "1"])
    assert done.returncode == 0, done.stderr
    (run_dir,) = (store / "runs").iterdir()

    outcome = ended_outcome({"store": str(store), "run_id": run_dir.name})
    assert outcome is not None
    assert (outcome.report.status, outcome.exit_code) == ("finished", 0)
    assert outcome.run_dir == run_dir.absolute()

    record = json.loads((run_dir / "run.json").read_text())  # a run cut before its end
    (run_dir / "run.json").write_text(json.dumps({**record, "status": "interrupted"}))
    assert ended_outcome({"store": str(store), "run_id": run_dir.name}) is None
    assert ended_outcome({"store": str(store), "run_id": None}) is None
