"""`open_evolve_service` given what it cannot use (found by README user review): an argument
of the wrong kind is one `TypeError` naming it, and a runtime whose ``async with`` has ended
a `RuntimeError`, both before anything is written. Before, a settings dict was an
`AttributeError` from inside, and a service on a closed runtime took the records and retired
each job as failed ("the evolane runtime is closed"), its records never measured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import evolane
from evolane.embed import Backends, ServiceSettings, open_evolve_service
from tests.evolve_helpers import trace_config, write_trace_target


@pytest.mark.parametrize(
    ("runtime", "config", "settings", "backends", "said"),
    [
        ("store", "ok", None, None, "runtime: the runtime of evolane.open_runtime, not str"),
        ("ok", 3, None, None, "config: a CampaignConfig or a dict of its flat fields, not int"),
        ("ok", "ok", {"mode": "shadow"}, None, "settings: a ServiceSettings(.*), not dict"),
        ("ok", "ok", None, {"judge": 1}, r"backends: a Backends\(replay=..., ...\), not dict"),
        ("ok", "ok", None, Backends(judge=1), "backends.judge: 1 is not callable"),  # type: ignore[arg-type]
    ],
)
async def test_an_argument_of_the_wrong_kind_is_one_type_error_naming_it(
    tmp_path: Path, runtime: Any, config: Any, settings: Any, backends: Any, said: str
) -> None:
    paths = write_trace_target(tmp_path, 1)
    async with evolane.open_runtime(store=paths["store"]) as opened:
        with pytest.raises(TypeError, match=said):
            async with open_evolve_service(
                opened if runtime == "ok" else str(paths["store"]),
                trace_config(paths) if config == "ok" else config,
                settings,
                backends=backends,
            ):
                pass
    assert not paths["store"].exists()


async def test_a_closed_runtime_opens_no_service(tmp_path: Path) -> None:
    paths = write_trace_target(tmp_path, 1)
    async with evolane.open_runtime(store=paths["store"]) as runtime:
        pass
    with pytest.raises(RuntimeError, match="runtime is closed"):
        async with open_evolve_service(runtime, trace_config(paths), ServiceSettings()):
            pass
    assert not paths["store"].exists()
