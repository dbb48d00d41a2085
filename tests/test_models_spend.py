"""Spend metered by role and priced by a table, through the real CLI: a judge command that
reports its usage is charged under ``judge`` (and stopped by a cost ceiling), a price table
turns token counts into the report's dollars and is frozen into run.json, and a model with
no price under a cost ceiling is refused before anything is written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evolane.inputs import InputError, PriceTable, load_prices, read_usage_document
from tests.campaign_helpers import shared_folder, toy_flags, write_toy

EVOLANE = [sys.executable, "-m", "evolane"]
PLAN = {"0.0": "fix:2", "0.1": "noop", "1.0": "fix:1", "1.1": "noop", "2.0": "noop", "2.1": "noop"}
PRICES = """\
# dollars per million tokens
agent-m:
  input: 1.0
  output: 2.0
judge-m:
  input: 3.0
  output: 4.0
  cache_read: 0.5
"""
REPLAY_TOKENS, REPLAY_COST = 1100, (1000 * 1.0 + 100 * 2.0) / 1e6
JUDGE_TOKENS, JUDGE_COST = 220, (100 * 3.0 + 100 * 0.5 + 20 * 4.0) / 1e6

JUDGE = """\
import json, os, sys
case = json.load(open(sys.argv[1]))
answer = json.load(open(os.path.join(sys.argv[2], "output.json")))
usage = {"model": "judge-m", "input_tokens": 200, "output_tokens": 20,
         "cached_input_tokens": 100, "cost_usd": USAGE_COST}
with open(os.environ["EVOLANE_USAGE_FILE"], "w") as out:
    json.dump(usage, out)
print(json.dumps({"score": 1.0 if answer == case["expected_output"] else 0.0}))
"""


def _run(args: list[str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EVOLANE, *args], capture_output=True, text=True, timeout=timeout)


def _workload(tmp_path: Path, judge_cost: float | None = None) -> tuple[list[str], Path]:
    """The toy campaign with a replay and a judge that report model usage; the judge's
    document also claims ``judge_cost`` dollars (None: no claim)."""
    paths = write_toy(tmp_path, PLAN)
    replay = tmp_path / "replay.sh"
    replay.write_text(
        'cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"\n'
        'echo \'{"model": "agent-m", "input_tokens": 1000, "output_tokens": 100}\' '
        '> "$2/usage.json"\n'
    )
    judge = tmp_path / "judge.py"
    judge.write_text(JUDGE.replace("USAGE_COST", repr(judge_cost)))
    store = tmp_path / "store"
    flags = toy_flags(paths, store)
    flags[flags.index("--replay") + 1] = f"sh {replay} {{candidate}} {{output_dir}}"
    flags += ["--judge", f"{sys.executable} -I {judge} {{case_file}} {{output_dir}}"]
    return flags, store


def _report(store: Path) -> dict:
    (run_dir,) = (store / "runs").iterdir()
    return json.loads((run_dir / "report.json").read_text())


def test_judge_and_replay_spend_are_priced_by_the_table_and_reported_by_role(
    tmp_path: Path,
) -> None:
    flags, store = _workload(tmp_path, judge_cost=99.0)  # the table wins over a claimed cost
    prices = tmp_path / "prices.yaml"
    prices.write_text(PRICES)
    done = _run(["optimize", *flags, "--prices", str(prices), "--max-cost-usd", "100"])
    assert done.returncode == 0, done.stderr
    report = _report(store)
    by_role = report["budget"]["spent_by_role"]
    judge, replay = by_role["judge"], by_role["replay"]
    judged = judge["tokens"] / JUDGE_TOKENS
    assert judged >= 12 and judged == int(judged)  # every judgement charged, whole
    assert judge["cost_usd"] == pytest.approx(judged * JUDGE_COST)
    replayed = replay["tokens"] / REPLAY_TOKENS
    assert replayed >= judged and replayed == int(replayed)
    assert replay["cost_usd"] == pytest.approx(replayed * REPLAY_COST)
    spent = report["budget"]["spent"]
    assert spent["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in by_role.values()))
    (run_dir,) = (store / "runs").iterdir()
    frozen = json.loads((run_dir / "run.json").read_text())["config"]["prices"]
    assert PriceTable(**frozen) == load_prices(prices)  # the dollars can be computed again
    markdown = (run_dir / "report.md").read_text()
    assert "| judge |" in markdown and "| replay |" in markdown
    estimate = _run(["estimate", *flags, "--prices", str(prices), "--json"])
    assert estimate.returncode == 0, estimate.stderr
    expected = json.loads(estimate.stdout)
    roles = expected["by_role"]  # from this run's spend per unit, at the next run's counts
    assert roles["judge"]["cost_usd"] == pytest.approx(
        roles["judge"]["tokens"] / JUDGE_TOKENS * JUDGE_COST
    )
    assert expected["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in roles.values()))
    text = _run(["estimate", *flags, "--prices", str(prices)])
    assert "spend: ~" in text.stdout and "by role " in text.stdout and "judge" in text.stdout


def test_a_cost_ceiling_stops_a_judge_that_spends(tmp_path: Path) -> None:
    """Replays cost nothing, each judgement $0.01: the run ends budget-limited near the
    ceiling; before judge spend was metered it ran to the end, spending 5x the ceiling."""
    flags, store = _workload(tmp_path, judge_cost=0.01)
    replay = tmp_path / "free.sh"
    replay.write_text(
        'cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"\n'
        'echo \'{"tokens": 0, "cost_usd": 0}\' > "$2/usage.json"\n'
    )
    flags[flags.index("--replay") + 1] = f"sh {replay} {{candidate}} {{output_dir}}"
    done = _run(["optimize", *flags, "--max-cost-usd", "0.05", "--unknown-price", "reserve"])
    assert done.returncode == 3, (done.returncode, done.stderr)
    budget = _report(store)["budget"]
    judge_lanes = 2  # at most one reservation past the ceiling per lane in flight
    assert 0.05 <= budget["spent"]["cost_usd"] <= 0.05 + 0.01 * judge_lanes + 1e-9
    assert budget["spent_by_role"]["judge"]["cost_usd"] == pytest.approx(
        budget["spent"]["cost_usd"]
    )


def _one_error_line(done: subprocess.CompletedProcess[str], needle: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("evolane: error:"), done.stderr
    assert needle in lines[0], lines[0]


def test_a_model_without_a_price_under_a_cost_ceiling_is_refused_before_the_run(
    tmp_path: Path,
) -> None:
    flags, store = _workload(tmp_path)
    rubric = tmp_path / "rubric.md"
    rubric.write_text("1 if the answer is yes\n")
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"models": {"other": {"input": 1, "output": 1}}}))
    flags[flags.index("--judge") + 1] = "llm:mystery-model"
    model = ["--rubric", str(rubric), "--prices", str(prices)]
    model += ["--llm-base-url", "http://127.0.0.1:9/v1"]  # a local server needs no key
    done = _run(["optimize", *flags, *model, "--max-cost-usd", "1"])
    _one_error_line(done, "'mystery-model'")
    assert not store.exists()  # nothing written
    no_rubric = _run(["optimize", *flags, "--max-cost-usd", "1"])
    _one_error_line(no_rubric, "--rubric")
    remote = [*model[:-1], "https://models.example.invalid/v1", "--llm-api-key-env", "NO_KEY_X"]
    no_key = _run(["optimize", *flags, *remote])  # found before any replay runs
    _one_error_line(no_key, "NO_KEY_X is not set")
    assert not store.exists()
    estimate = _run(
        ["estimate", *flags, *model, "--max-cost-usd", "1", "--unknown-price", "reserve"]
    )
    assert estimate.returncode == 0, estimate.stderr


@pytest.mark.parametrize("tail", ["?api-key=sk-in-the-url-0123", "#sk-in-the-url-0123"])
def test_a_base_url_with_a_query_or_fragment_is_refused_before_the_run(
    tmp_path: Path, tail: str
) -> None:
    """Stored in run.json, the journal and the reports, and (a query) put by the SDK before
    the request's path, so that every call failed: refused, one line, the URL not echoed."""
    flags, store = _workload(tmp_path)
    rubric = tmp_path / "rubric.md"
    rubric.write_text("1 if the answer is yes\n")
    flags[flags.index("--judge") + 1] = "llm:judge-m"
    url = "http://127.0.0.1:9/v1" + tail
    done = _run(["optimize", *flags, "--rubric", str(rubric), "--llm-base-url", url])
    _one_error_line(done, "--llm-base-url")
    assert "sk-in-the-url" not in done.stderr + done.stdout
    assert not store.exists()


@pytest.mark.parametrize("flag", ["--pass-env", "--llm-api-key-env"])
def test_a_key_given_for_a_variable_name_is_refused_before_the_run(
    tmp_path: Path, flag: str
) -> None:
    """A value that is no variable's name (the key itself, ``NAME=value``) was stored in
    run.json and the report; under --pass-env every command then failed to start (exit 1)."""
    flags, store = _workload(tmp_path)
    rubric = tmp_path / "rubric.md"
    rubric.write_text("1 if the answer is yes\n")
    flags[flags.index("--judge") + 1] = "llm:judge-m"
    model = ["--rubric", str(rubric), "--llm-base-url", "http://127.0.0.1:9/v1"]
    done = _run(["optimize", *flags, *model, flag, "sk-proj-given-for-a-name-0123"])
    _one_error_line(done, flag)
    assert "sk-proj-given" not in done.stderr + done.stdout
    assert not store.exists()


@pytest.mark.parametrize(
    ("name", "content", "needle"),
    [
        ("p.yaml", "m:\n  input: 1\n  output: [\n", "p.yaml:"),
        ("p.json", '{"m": {"input": -1, "output": 1}}', "m.input"),
        ("p.json", '{"m": {"input": 1, "output": 1, "per": 3}}', "m.per"),
        ("p.json", "[1, 2]", "mapping"),
    ],
)
def test_a_bad_price_file_is_one_line_naming_it(
    tmp_path: Path, name: str, content: str, needle: str
) -> None:
    flags, _ = _workload(tmp_path)
    path = tmp_path / name
    path.write_text(content)
    _one_error_line(_run(["optimize", *flags, "--prices", str(path)]), needle)


def test_a_usage_document_is_priced_with_cache_reads_and_writes() -> None:
    table = PriceTable(models={"m": {"input": 2, "output": 8, "cache_read": 0.5, "cache_write": 3}})
    doc = {"model": "m", "input_tokens": 1000, "output_tokens": 10, "cached_input_tokens": 500,
           "cache_write_tokens": 100, "cost_usd": 7.0}  # fmt: skip
    reading = read_usage_document(doc, table)
    assert reading.tokens == 1010 and reading.complete and not reading.unpriced
    assert reading.cost_usd == pytest.approx((400 * 2 + 500 * 0.5 + 100 * 3 + 10 * 8) / 1e6)
    unpriced = read_usage_document({"model": "x", "input_tokens": 5, "output_tokens": 1}, table)
    assert unpriced.cost_usd is None and unpriced.unpriced and not unpriced.complete
    claimed = read_usage_document({"model": "x", "tokens": 3, "cost_usd": 0.1}, table)
    assert claimed.complete and claimed.cost_usd == 0.1  # no price: the claim stands


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a loaded host
@given(st.dictionaries(st.sampled_from(["model", "tokens", "cost_usd", "input_tokens",
                                        "output_tokens", "cached_input_tokens", "cached"]),
                       st.none() | st.booleans() | st.integers(-5, 10**9) | st.text(max_size=5)
                       | st.floats(allow_nan=True)))  # fmt: skip
def test_any_usage_document_reads_without_error_and_never_negative(doc: dict) -> None:
    table = PriceTable(models={"m": {"input": 1, "output": 1}})
    reading = read_usage_document(doc, table)
    assert reading.tokens is None or reading.tokens >= 0
    assert reading.cost_usd is None or reading.cost_usd >= 0


def test_a_missing_price_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no-such"):
        load_prices(tmp_path / "no-such.json")


COUNTING_JUDGE = """\
import glob, json, os, sys, time, uuid
log = sys.argv[3]
mine = os.path.join(log, f"running-{uuid.uuid4().hex}")  # pids repeat across pid namespaces
open(mine, "w").close()
with open(os.path.join(log, "calls"), "a") as out:
    out.write(f"{len(glob.glob(os.path.join(log, 'running-*')))}\\n")
time.sleep(0.2)
os.remove(mine)
case = json.load(open(sys.argv[1]))
answer = json.load(open(os.path.join(sys.argv[2], "output.json")))
if COST is not None:
    with open(os.environ["EVOLANE_USAGE_FILE"], "w") as out:
        json.dump({"tokens": 10} | ({} if COST == "tokens" else {"cost_usd": COST}), out)
print(json.dumps({"score": 1.0 if answer == case["expected_output"] else 0.0}))
"""


def _counting(tmp_path: Path, cost: float | str | None, lanes: int) -> tuple[list[str], Path, Path]:
    """The toy with free replays and a judge that logs how many judges run at once (one line
    per call) and reports ``cost`` dollars per call (None: no usage document; "tokens": 10
    tokens and no dollars)."""
    flags, store = _workload(tmp_path)
    replay = tmp_path / "free.sh"
    replay.write_text(
        'cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"\n'
        'echo \'{"tokens": 0, "cost_usd": 0}\' > "$2/usage.json"\n'
    )
    log = shared_folder(tmp_path / "log")
    judge = tmp_path / "counting.py"
    judge.write_text(COUNTING_JUDGE.replace("COST", repr(cost)))
    flags[flags.index("--replay") + 1] = f"sh {replay} {{candidate}} {{output_dir}}"
    flags[flags.index("--judge") + 1] = (
        f"{sys.executable} -I {judge} {{case_file}} {{output_dir}} {log}"
    )
    flags += ["--judge-concurrency", str(lanes), "--expose-rw", str(log)]
    return flags, store, log


def test_judges_waiting_for_a_lane_hold_no_budget_and_are_never_charged(tmp_path: Path) -> None:
    """One slow judge lane, fast replays: many judgements queue. Only judges that ran are
    charged (a queued judge once held a reservation and was charged it at the stop, so the
    campaign ended at a fraction of its budget)."""
    flags, store, log = _counting(tmp_path, cost=0.001, lanes=1)
    done = _run(["optimize", *flags, "--max-cost-usd", "0.02"])
    assert done.returncode == 3, done.stderr
    calls = len((log / "calls").read_text().splitlines())
    budget = _report(store)["budget"]
    assert budget["spent_by_role"]["judge"]["cost_usd"] == pytest.approx(calls * 0.001)
    assert budget["spent"]["cost_usd"] >= 0.02  # it ran until the ceiling, not before


def test_a_judge_that_reports_no_usage_spends_nothing_and_is_not_serialised(
    tmp_path: Path,
) -> None:
    """A judge command that writes no usage document is a rule, not a model: under a cost
    ceiling it runs on every judge lane (not one at a time) and costs nothing."""
    flags, store, log = _counting(tmp_path, cost=None, lanes=2)
    done = _run(["optimize", *flags, "--max-cost-usd", "1"])
    assert done.returncode == 0, done.stderr
    running = [int(n) for n in (log / "calls").read_text().split()]
    assert max(running) == 2  # two judges overlapped
    assert _report(store)["budget"]["spent_by_role"]["judge"]["cost_usd"] == 0


def test_a_judge_reporting_tokens_only_runs_on_every_lane_under_a_token_ceiling(
    tmp_path: Path,
) -> None:
    """Tokens and no dollars (no --prices) was an incomplete document as a whole: no token
    estimate ever came, and under --max-tokens the judges ran one at a time for good."""
    flags, store, log = _counting(tmp_path, cost="tokens", lanes=2)
    done = _run(["optimize", *flags, "--max-tokens", "100000"])
    assert done.returncode == 0, done.stderr
    running = [int(n) for n in (log / "calls").read_text().split()]
    assert max(running) == 2  # two judges overlapped
    judged = _report(store)["budget"]["spent_by_role"]["judge"]["tokens"]
    assert judged == 10 * len(running)
