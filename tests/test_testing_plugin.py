"""The pytest plugin as a user meets it: a user-style test of a custom in-process backend,
run through pytester with the plugin's `runtime`, `chaos` and `no_leaks` fixtures; and the
plugin, loaded in every pytest session, loads none of the runtime."""

from __future__ import annotations

import subprocess
import sys

import pytest

USER_TEST = """
import json, sys
from pathlib import Path

import evolane
from evolane.embed import Backends, BackendCall, OptimizeRequest

CASES = 12


def workload(root: Path) -> evolane.CampaignConfig:
    target = root / "target"
    target.mkdir()
    rows = []
    for i in range(CASES):
        (target / f"c{i}").write_text("yes" if i < 4 else "no")
        rows.append({"id": f"c{i}", "input": {}, "expected_output": "yes", "split": "val"})
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
    fix = "sh -c 'for f in {workdir}/c*; do echo yes > $f; done'"
    return evolane.CampaignConfig(
        target=str(target), dataset=str(root / "data.jsonl"), store=str(root / "store"),
        replay="backend:my-agent", optimizer=fix, iterations=2, population=2,
        replay_concurrency=3, kill_grace=0.2,
    )


async def my_agent(call: BackendCall) -> None:
    answer = (call.candidate / call.case["id"]).read_text().strip()
    (call.output_dir / "output.json").write_text(json.dumps(answer))


async def test_my_agent_backend_survives_injected_faults(runtime, chaos, no_leaks, tmp_path):
    chaos.delivery_delay = 0.3
    chaos.handler_crash = 0.05
    chaos.only = (".replay-",)  # crash replay lanes; their supervisor restarts them
    chaos.spawn_failure = 0.25  # the optimizer command sometimes cannot start
    config = workload(tmp_path)
    report = await runtime.optimize(
        OptimizeRequest(config=config), backends=Backends(replay=my_agent)
    )
    assert report.status == "finished"
    assert chaos.injected["delivery_delay"] > 0
    assert sum(chaos.injected.values()) > 0
    no_optimizer = [f for f in report.funnel if f.reason.startswith("the optimizer failed")]
    refused = [f for f in report.failures if "chaos: refused to spawn" in f.failure.message]
    assert len(no_optimizer) == len(refused) == chaos.injected["spawn_failure"]
"""


@pytest.mark.parametrize("seed", ["1", "2"])
def test_the_plugin_fixtures_drive_a_user_style_test(pytester: pytest.Pytester, seed: str) -> None:
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    pytester.makepyfile(test_user=USER_TEST)
    result = pytester.runpytest_subprocess(
        "-q", "-p", "no:cacheprovider", f"--evolane-chaos-seed={seed}"
    )
    result.assert_outcomes(passed=1)


def test_chaos_is_deterministic_for_a_seed() -> None:
    from evolane.testing import Chaos

    def schedule(seed: int) -> list[bool]:
        chaos = Chaos(seed=seed, spawn_failure=0.5)
        outcomes = []
        for _ in range(50):
            try:
                chaos.before_spawn("x")
                outcomes.append(False)
            except OSError:
                outcomes.append(True)
        return outcomes

    assert schedule(3) == schedule(3)
    assert schedule(3) != schedule(4)
    assert 10 < sum(schedule(3)) < 40


def test_the_plugin_loads_none_of_the_runtime() -> None:
    """pytest loads the plugin in every session of an environment where evolane is installed,
    a project's own tests included: found by review, it imported trio, pydantic, psutil and
    the sandbox there (~0.4 s more for each pytest run); the fixtures now import them."""
    code = (
        "import sys, evolane.testing.plugin; "
        "print(*sorted(m for m in sys.modules if m.split('.')[0] in HEAVY "
        "or m.startswith(('evolane.sandbox', 'evolane.messages', 'evolane.store'))))"
    ).replace("HEAVY", repr({"trio", "pydantic", "psutil", "numpy", "orjson"}))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []


def test_no_leaks_under_an_inherited_lease_spares_the_other_holders(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pytest run as an evolane replay inherits the unit's lease: found by review, `no_leaks`
    took it as the test's own and SIGKILLed every other process holding it (the replay's own
    shell, the unit's other processes) after a test that leaked nothing."""
    outer = "rt-outer-review/unit-1"
    sibling = subprocess.Popen(
        ["sleep", "60"], env={"PATH": "/usr/bin:/bin", "EVOLANE_LEASE": outer}
    )
    try:
        monkeypatch.setenv("EVOLANE_LEASE", outer)
        pytester.makepyfile(
            test_user="import subprocess\n\n"
            "def test_clean(no_leaks):\n    subprocess.run(['true'], check=True)\n\n"
            "def test_leaky(no_leaks):\n    subprocess.Popen(['setsid', 'sleep', '60'])\n"
        )
        result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
        result.assert_outcomes(passed=2, errors=1)
        assert sibling.poll() is None, "no_leaks killed a process of the inherited lease"
    finally:
        sibling.kill()
        sibling.wait()
