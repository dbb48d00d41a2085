"""Found by review: ``--pass-env``, ``--expose`` and ``--expose-rw`` reached every command, so
a key passed or exposed for a coding-agent optimizer was readable by every replay, which runs
the candidate's code. A grant written ``ROLE=VALUE`` now reaches that role's commands alone;
one without a role still reaches every command, as a run.json from before roles does.

Each run here is real (``evolane optimize``, confined): every command (replay, judge,
optimizer, validator, post-apply check) writes what it saw of ``$SECRET`` and of a key file
into a spy folder exposed to all; a replay and a judge print it too (the store keeps it).
The key file's path is named in no template, so only an ``--expose`` shows it. On the code
before roles the role-prefixed tests fail by the syntax alone (``--pass-env
optimizer=SECRET`` was refused, exit 2); the unprefixed test fails there because the
validator and the check got no ``--pass-env`` variable at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from evolane.sandbox._confine import confinement_problem
from evolane.sandbox._netns import own_network_problem
from tests.campaign_helpers import run_optimize, shared_folder, toy_flags, write_toy
from tests.sandbox_helpers import host_address

pytestmark = pytest.mark.skipif(
    confinement_problem() is not None, reason=f"{confinement_problem()}"
)

SECRET = "grant-secret-5d1e9a"
KEY = "grant-key-file-8c2f47"
ROLES = ("replay", "judge", "optimizer", "validator", "check")

SPY = textwrap.dedent(
    """
    import json, os, runpy, sys, tempfile, time
    role, rest = sys.argv[1], sys.argv[2:]
    try:
        key = open(KEY_PATH).read().strip()
    except OSError as error:
        key = type(error).__name__
    nets = []
    for address in NET:  # real servers of the test's on the host
        import socket
        try:
            socket.create_connection(address, timeout=5).close()
            nets.append("connected")
        except OSError as error:
            nets.append(type(error).__name__)
    net = ",".join(nets) or "-"
    seen = {"role": role, "env": os.environ.get("SECRET", "-"), "key": key, "net": net}
    handle, _ = tempfile.mkstemp(dir=SPY_DIR, prefix=role + ".", suffix=".json")
    os.write(handle, json.dumps(seen).encode())
    os.close(handle)
    if role in ("replay", "judge"):  # kept in the store with the unit
        print(json.dumps(seen), file=sys.stderr)
    if role == "replay":
        while os.path.exists(os.path.join(SPY_DIR, "hold")):  # the test kills the run here
            time.sleep(0.05)
        candidate, out = rest
        answer = open(os.path.join(candidate, os.environ["EVOLANE_CASE_ID"])).read()
        open(os.path.join(out, "output.json"), "w").write(answer)
    elif role == "judge":
        case = json.load(open(rest[0]))
        answer = json.load(open(os.path.join(rest[1], "output.json")))
        print(json.dumps({"score": 1.0 if answer == case["expected_output"] else 0.0}))
    elif role == "optimizer":
        sys.argv = rest
        runpy.run_path(rest[0], run_name="__main__")
    """
)


def _setup(root: Path, net: tuple[tuple[str, int], ...] = ()) -> tuple[list[str], Path, Path]:
    """The flags of a run whose every command spies, the spy folder and the key file; each
    command also tries to connect to each (host, port) of ``net``, its ``net`` said in order."""
    paths = write_toy(root / "toy", {"default": "fix:8"}, val=8, test=8, passing=2)
    spy = shared_folder(root / "spy")
    key = root / "secret" / "key.txt"
    key.parent.mkdir()
    key.write_text(KEY + "\n")
    key.parent.chmod(0o755)
    key.chmod(0o644)
    tools = root / "tools"
    tools.mkdir()
    script = tools / "spy.py"
    script.write_text(f"KEY_PATH = {str(key)!r}\nSPY_DIR = {str(spy)!r}\nNET = {net!r}\n{SPY}")
    run = f"{sys.executable} -I {script}"
    flags = toy_flags(paths, paths["store"])
    flags[flags.index("--replay") + 1] = f"{run} replay {{candidate}} {{output_dir}}"
    flags[flags.index("--optimizer") + 1] = (
        f"{run} optimizer {paths['script']} {{workdir}} {{prompt_file}} {paths['plan']}"
    )
    flags += ["--judge", f"{run} judge {{case_file}} {{output_dir}}"]
    flags += ["--validator", f"{run} validator {{candidate}}"]
    flags += ["--apply", "auto_verified", "--check", f"{run} check {{candidate}}"]
    flags += ["--iterations", "1", "--population", "1", "--isolation", "confined"]
    flags += ["--expose-rw", str(spy)]
    return flags, spy, key


def _seen(spy: Path, names: set[str] | None = None) -> dict[str, set[tuple[str, str]]]:
    """Per role, the (variable, key file) pairs its commands saw (only the spy files in
    ``names`` when given)."""
    seen: dict[str, set[tuple[str, str]]] = {}
    for path in spy.glob("*.json"):
        if names is None or path.name in names:
            account = json.loads(path.read_text())
            seen.setdefault(account["role"], set()).add((account["env"], account["key"]))
    return seen


def _store_text(store: Path) -> bytes:
    return b"".join(p.read_bytes() for p in store.rglob("*") if p.is_file())


def test_a_grant_given_to_the_optimizer_reaches_no_replay_or_judge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SECRET", SECRET)
    flags, spy, key = _setup(tmp_path)
    flags += ["--pass-env", "optimizer=SECRET", "--expose", f"optimizer={key}"]
    done = run_optimize(flags, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "apply (auto_verified): applied" in done.stdout, done.stdout  # the check ran
    seen = _seen(spy)
    assert set(seen) == set(ROLES), seen
    assert seen["optimizer"] == {(SECRET, KEY)}
    for role in ("replay", "judge", "validator", "check"):
        assert seen[role] == {("-", "FileNotFoundError")}, (role, seen[role])
    stored = _store_text(tmp_path / "toy" / "store")  # what the commands printed
    assert SECRET.encode() not in stored and KEY.encode() not in stored
    run_json = next((tmp_path / "toy" / "store" / "runs").glob("*/run.json")).read_text()
    stored = json.loads(run_json)["config"]
    assert stored["pass_env"] == ["optimizer=SECRET"]
    assert stored["expose"] == [f"optimizer={key}"]


def test_a_grant_without_a_role_still_reaches_every_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SECRET", SECRET)
    flags, spy, key = _setup(tmp_path)
    flags += ["--pass-env", "SECRET", "--expose", str(key)]
    done = run_optimize(flags, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert _seen(spy) == {role: {(SECRET, KEY)} for role in ROLES}
    stored = _store_text(tmp_path / "toy" / "store")  # the control of the check above
    assert SECRET.encode() in stored and KEY.encode() in stored


def test_a_grant_given_to_two_roles_reaches_those_two(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given twice with different roles; a path exposed to the judge is the judge's alone."""
    monkeypatch.setenv("SECRET", SECRET)
    flags, spy, key = _setup(tmp_path)
    flags += ["--pass-env", "optimizer=SECRET", "--pass-env", "validator=SECRET"]
    flags += ["--expose", f"judge={key}"]
    done = run_optimize(flags, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    seen = _seen(spy)
    assert seen["optimizer"] == seen["validator"] == {(SECRET, "FileNotFoundError")}
    assert seen["judge"] == {("-", KEY)}
    assert seen["replay"] == seen["check"] == {("-", "FileNotFoundError")}


HOST_ADDRESS = host_address()


@contextlib.contextmanager
def _listening(host: str) -> Iterator[tuple[tuple[str, int], list[int]]]:
    """A real TCP server on ``host``: its address, and one entry per connection it took."""
    with socket.create_server((host, 0)) as server:
        server.settimeout(0.2)
        heard: list[int] = []
        stop = threading.Event()

        def listen() -> None:
            while not stop.is_set():
                try:
                    server.accept()[0].close()
                except OSError:  # the timeout: look at the stop flag again
                    continue
                heard.append(1)

        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        try:
            yield (host, server.getsockname()[1]), heard
        finally:
            stop.set()
            listener.join()


@pytest.mark.skipif(HOST_ADDRESS is None, reason="no address of this host's but loopback")
def test_the_network_given_to_the_optimizer_reaches_no_replay_or_judge(tmp_path: Path) -> None:
    """Found by review: ``--network`` had no role, so a coding-agent optimizer's network
    let every replay (the candidate's code) and judge reach the host's loopback services
    and send anything anywhere. ``--network-for ROLE`` gives it to that role alone. The
    server is on this host's own address, not its loopback, which no command reaches."""
    assert HOST_ADDRESS is not None
    with _listening(HOST_ADDRESS) as (address, heard):
        flags, spy, _ = _setup(tmp_path, net=(address,))
        flags += ["--network-for", "optimizer", "--network-for", "check"]
        done = run_optimize(flags, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    nets: dict[str, set[str]] = {}
    for path in spy.glob("*.json"):
        account = json.loads(path.read_text())
        nets.setdefault(account["role"], set()).add(account["net"])
    assert nets["optimizer"] == nets["check"] == {"connected"}, nets
    for role in ("replay", "judge", "validator"):
        assert "connected" not in nets[role], (role, nets[role])
    assert len(heard) == len(list(spy.glob("optimizer.*.json"))) + 1  # and the one check
    run = next((tmp_path / "toy" / "store").glob("runs/*/report.json")).parent
    report = json.loads((run / "report.json").read_text())
    assert report["isolation"].startswith("confined (network: optimizer, check)"), report
    assert "(bubblewrap, network for optimizer, check only)" in (run / "report.md").read_text()


@pytest.mark.skipif(own_network_problem() is not None, reason=f"{own_network_problem()}")
def test_a_replay_given_the_network_reaches_no_loopback_service_of_the_host(
    tmp_path: Path,
) -> None:
    """Found by review: a role given the network shared the host's network namespace, so a
    replay (the candidate's code) given it connected to the host's loopback services (a
    database, a local model server, evolane's own Dask scheduler) as evolane's user. It now
    has a namespace of its own whose only way out is slirp4netns' outbound NAT: the server
    on the host's loopback is out of reach, one on this host's own address is not."""
    with contextlib.ExitStack() as servers:
        loopback, heard = servers.enter_context(_listening("127.0.0.1"))
        targets = (loopback,)
        if HOST_ADDRESS is not None:
            targets += (servers.enter_context(_listening(HOST_ADDRESS))[0],)
        flags, spy, _ = _setup(tmp_path, net=targets)
        done = run_optimize([*flags, "--network-for", "replay"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    replays = {json.loads(p.read_text())["net"] for p in spy.glob("replay.*.json")}
    outside = ",connected" if HOST_ADDRESS is not None else ""
    assert replays == {"ConnectionRefusedError" + outside}, replays
    assert not heard


def test_a_replay_given_the_hosts_network_reaches_its_loopback_as_asked(tmp_path: Path) -> None:
    # An agent calling a model server on the host's loopback (Ollama, vLLM) needs the
    # host's network: --host-network-for ROLE gives that role the host's namespace, as
    # --network did before, and no other role gets any network.
    with _listening("127.0.0.1") as (loopback, heard):
        flags, spy, _ = _setup(tmp_path, net=(loopback,))
        done = run_optimize([*flags, "--host-network-for", "replay"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    replays = {json.loads(p.read_text())["net"] for p in spy.glob("replay.*.json")}
    assert replays == {"connected"}, replays
    assert len(heard) == len(list(spy.glob("replay.*.json")))
    nets = {json.loads(p.read_text())["net"] for p in spy.glob("optimizer.*.json")}
    assert nets and "connected" not in nets, nets
    report = json.loads(next((tmp_path / "toy" / "store").glob("runs/*/report.json")).read_text())
    assert report["isolation"].startswith("confined (network: replay [host's network: replay])")


@pytest.mark.parametrize(
    ("given", "line"),
    [
        (["--pass-env", "replays=SECRET"], "--pass-env replays=...: 'replays' is no command's"),
        (["--pass-env", "optimizer="], "--pass-env optimizer=: nothing given for optimizer"),
        (["--pass-env", "OPENAI_API_KEY=sk-live-1"], "--pass-env OPENAI_API_KEY=...: "),
        (["--pass-env", "sk-live-1"], "--pass-env ...: not a variable's name"),
        (["--pass-env", "optimizer=sk-live-1"], "--pass-env optimizer=...: not a variable's"),
        (["--expose", "agent=/etc"], "--expose agent=/etc: 'agent' is no command's role"),
        (["--expose-rw", "judge="], "--expose-rw judge=: nothing given for judge"),
        (["--network-for", "agent"], "--network-for agent: no command's role: choose from"),
        (["--host-network-for", "x"], "--host-network-for x: no command's role: choose from"),
    ],
)
def test_a_bad_role_or_an_empty_grant_is_one_line_and_exit_2(
    tmp_path: Path, given: list[str], line: str
) -> None:
    paths = write_toy(tmp_path, {"default": "noop"})
    done = run_optimize([*toy_flags(paths, paths["store"]), *given, "--dry-run"], cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    (error,) = done.stderr.strip().splitlines()
    assert line in error, error
    assert "sk-live-1" not in done.stderr + done.stdout  # a key given as a name is not echoed
    assert not (paths["store"] / "runs").exists()


def test_a_resumed_run_keeps_each_roles_grants(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed while its first replays wait, then resumed (without the flags): the replays
    and the optimizer after the resume see what the run's grants gave each."""
    monkeypatch.setenv("SECRET", SECRET)
    flags, spy, key = _setup(tmp_path)
    flags += ["--pass-env", "optimizer=SECRET", "--expose", f"optimizer={key}"]
    (spy / "hold").write_text("")
    command = [sys.executable, "-m", "evolane", "optimize", *flags]
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120  # a guard against a hang, not a timing figure
    while not list(spy.glob("replay.*.json")):
        assert process.poll() is None, "the run ended before its first replay"
        assert time.monotonic() < deadline, "no replay started"
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    (spy / "hold").unlink()
    before = {path.name for path in spy.glob("*.json")}
    store = tmp_path / "toy" / "store"
    (run_dir,) = (store / "runs").iterdir()
    resumed = run_optimize(["--resume", run_dir.name, "--store", str(store)], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    after = {path.name for path in spy.glob("*.json")} - before
    seen = _seen(spy, after)
    assert seen["optimizer"] == {(SECRET, KEY)}
    assert seen["replay"] == seen["judge"] == {("-", "FileNotFoundError")}
