"""``report.html`` (issue 19): one self-contained page per run, checked by parsing it.

The example campaign runs once through the real CLI; its page must parse, fetch nothing,
show every candidate with report.json's numbers, and hide what looks like a credential.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from evolane.views import History, ViewState, render_html
from evolane.views._data import Candidate, PageData

EVOLANE = [sys.executable, "-m", "evolane"]
VOID = {"meta", "br", "hr", "img", "input", "link", "polyline", "polygon", "line", "circle", "rect"}


class Page(HTMLParser):
    """A checking parse: every element closed in order, and what the tests look for."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.errors: list[str] = []
        self.title = ""
        self.rows: list[list[str]] = []  # the candidates table's rows, as cell texts
        self._in_title = False
        self._table = ""
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {k: v or "" for k, v in attrs}
        self.tags.append((tag, found))
        if tag not in VOID:
            self.stack.append(tag)
        self._in_title = tag == "title" and "head" in self.stack
        if tag == "table":
            self._table = found.get("class", "")
        elif tag == "tr" and self._table == "candidates":
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = []

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()
        self._in_title = False
        if tag == "td" and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if self._row:
                self.rows.append(self._row)
            self._row = None
        elif tag == "table":
            self._table = ""

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        if self._cell is not None:
            self._cell.append(data)


def parse(text: str) -> Page:
    page = Page()
    page.feed(text)
    page.close()
    assert not page.errors, page.errors[:5]
    assert page.stack == [], f"unclosed: {page.stack}"
    return page


def assert_self_contained(text: str, page: Page) -> None:
    """Nothing the page would fetch: no script, stylesheet link, image, frame, CSS url() or
    @import, and no link with a scheme or to another host."""
    lowered = text.lower()
    assert "<script" not in lowered and "@import" not in lowered and "url(" not in lowered
    assert not re.search(r"\b(https?|ftp|wss?):", lowered), "an external URL in the page"
    for tag, attrs in page.tags:
        assert tag not in {"script", "link", "img", "iframe", "object", "embed", "base"}, tag
        for name in ("src", "href", "srcset", "action", "xlink:href"):
            value = attrs.get(name, "")
            assert not value.startswith("//") and ":" not in value.split("/")[0], value


@pytest.fixture(scope="module")
def example_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The sleeper example, run once through the CLI: (store, run directory)."""
    store = tmp_path_factory.mktemp("html") / "store"
    args = ["optimize", "--example", "sleeper", "--store", str(store), "--progress", "none"]
    if not os.environ.get("EVOLANE_SCREENSHOT"):  # docs/report.png shows the default run
        args += ["--iterations", "2"]  # 4 candidates, some accepted: every part of the page
    done = subprocess.run(  # in its own folder: nothing lands in the checkout
        [*EVOLANE, *args], capture_output=True, text=True, timeout=600, cwd=store.parent
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (run_dir,) = (store / "runs").iterdir()
    assert str(run_dir / "report.html") in done.stdout  # the summary names the page
    return store, run_dir


def test_every_run_writes_a_self_contained_page(example_run: tuple[Path, Path]) -> None:
    _, run_dir = example_run
    text = (run_dir / "report.html").read_text(encoding="utf-8")
    page = parse(text)
    assert_self_contained(text, page)
    report = json.loads((run_dir / "report.json").read_text())
    assert page.title == f"evolane report {report['run_id']}"
    sections = {attrs.get("id") for tag, attrs in page.tags if tag == "section"}
    assert {"score", "gate", "lineage", "funnel", "heatmap", "spend", "lanes", "diff"} <= sections
    assert len(text) < 2_000_000  # summary-sized: artifacts are linked, not inlined


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def test_the_page_shows_every_candidate_with_the_reports_numbers(
    example_run: tuple[Path, Path],
) -> None:
    _, run_dir = example_run
    text = (run_dir / "report.html").read_text(encoding="utf-8")
    page = parse(text)
    report = json.loads((run_dir / "report.json").read_text())
    paired = {
        (m["iteration"], m["slot"]): m for m in report["measurements"] if m["purpose"] == "paired"
    }
    funnel = sorted(report["funnel"], key=lambda e: (e["cycle"], e["iteration"], e["slot"]))
    assert len(page.rows) == len(funnel) > 0
    for row, entry in zip(page.rows, funnel, strict=True):
        cycle, iteration, slot, digest, reached, outcome, delta, interval, n, _ = row
        assert (int(cycle), int(iteration), int(slot)) == (
            entry["cycle"],
            entry["iteration"],
            entry["slot"],
        )
        assert entry["digest"][7:19] == digest and reached == entry["terminal"]
        assert outcome == (entry.get("decision") or "gated_out")
        m = paired[(entry["iteration"], entry["slot"])]
        assert delta == _fmt(m["mean_delta"], "+.4f")
        assert interval == f"[{m['ci_low']:+.4f}, {m['ci_high']:+.4f}]" and int(n) == m["n"]
    marks = [a for tag, a in page.tags if tag == "circle" and "mark" in a.get("class", "")]
    assert len(marks) == len(funnel)  # the gate plot has every candidate
    nodes = [a for tag, a in page.tags if tag == "circle" and "node" in a.get("class", "")]
    assert len(nodes) == len(funnel) + 1  # the lineage tree: the seed and every candidate
    on_path = [a for a in nodes if "on-path" in a["class"]]
    assert len(on_path) == len(report["lineage"])
    scores = report["scores"]
    for key in ("baseline_val", "best_val", "baseline_test", "best_test"):
        s = scores[key]
        assert f"{s['mean']:.4f} [{s['ci_low']:.4f}, {s['ci_high']:.4f}] (n={s['n']})" in text
    spent = report["budget"]["spent"]
    assert f"<td class='num'>{spent['tokens']:.0f}</td>" in text
    for role, usage in report["budget"]["spent_by_role"].items():
        assert f"<td>{role}</td><td class='num'>{usage['tokens']:.0f}</td>" in text


def test_report_format_html_draws_the_page_again(example_run: tuple[Path, Path]) -> None:
    store, run_dir = example_run
    page = run_dir / "report.html"
    before = page.read_text(encoding="utf-8")
    page.unlink()  # as for a run from before the page existed
    done = subprocess.run(
        [*EVOLANE, "report", run_dir.name, "--store", str(store), "--format", "html"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == before == page.read_text(encoding="utf-8")


def test_report_format_html_of_a_run_without_report_is_one_error_line(tmp_path: Path) -> None:
    store = tmp_path / "store"
    run_dir = store / "runs" / "r-1"
    run_dir.mkdir(parents=True)
    done = subprocess.run(
        [*EVOLANE, "report", "r-1", "--store", str(store), "--format", "html"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "r-1" in done.stderr


HOSTILE = "<script>alert(1)</script> https://user:hunter2@example.com/x?api_key=SECRET1 "


def _hostile_report() -> dict[str, Any]:
    return {
        "run_id": "r-<b>x</b>",
        "campaign_id": "c-1",
        "status": "finished",
        "message": HOSTILE + "Authorization: Bearer tok-SECRET2 sk-abcdefghijklmnopSECRET3",
        "config": {"gate": {"min_effect": 0.0}, "replay": HOSTILE},
        "seed": {"digest": "sha256:" + "0" * 64},
        "budget": {"spent": {"tokens": 1.0}, "spent_by_role": {"<i>role</i>": {"tokens": 1}}},
        "funnel": [
            {
                "cycle": 0,
                "iteration": 0,
                "slot": 0,
                "digest": "sha256:" + "1" * 64,
                "terminal": "blocked",
                "decision": "",
                "reason": HOSTILE,
            },
        ],
    }


def test_the_page_escapes_everything_and_hides_credentials() -> None:
    report = _hostile_report()
    candidate = Candidate(0, 0, 0, "sha256:" + "1" * 64, "", "blocked", "gated_out", HOSTILE)
    data = PageData(report=report, history=History(), candidates=[candidate], diff=HOSTILE)
    text = render_html(data, {"evil": "javascript:alert(1)"[:0] + "objects/ab/cd"})
    page = parse(text)
    for secret in ("hunter2", "SECRET1", "SECRET2", "SECRET3"):
        assert secret not in text, secret
    assert "<script" not in text and "<b>x</b>" not in text and "<i>role</i>" not in text
    assert "&lt;script&gt;" in text
    assert page.title.startswith("evolane report r-<b>x</b>")  # shown as text, not markup


def test_a_page_with_nothing_measured_still_draws() -> None:
    """A run stopped before any candidate: every panel draws from empty series."""
    text = render_html(PageData(report={"run_id": "r-0"}, history=ViewState().history), {})
    parse(text)
    assert "No candidate was accepted." in text


# --- a real browser ---------------------------------------------------------------------------


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("EVOLANE_REQUIRE_BROWSER"):
        pytest.fail("no chromium on PATH, and EVOLANE_REQUIRE_BROWSER is set (CI installs it)")
    pytest.skip("no chromium on PATH (CI installs Debian's chromium)")


def _browse(page: Path, tmp_path: Path, *how: str) -> subprocess.CompletedProcess[bytes]:
    args = [
        _chromium(),
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        *how,
        page.as_uri(),
    ]
    done = subprocess.run(args, capture_output=True, timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def _png_pixels(data: bytes) -> tuple[int, int, bytes]:
    """Width, height and the filtered scanlines of a PNG (enough to see it is not blank)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    at, size, idat = 8, (0, 0), b""
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        at += 12 + length
    return size[0], size[1], zlib.decompress(idat)


@pytest.mark.browser
def test_chromium_renders_the_page(example_run: tuple[Path, Path], tmp_path: Path) -> None:
    _, run_dir = example_run
    page = run_dir / "report.html"
    dom = _browse(page, tmp_path, "--dump-dom").stdout.decode("utf-8", "replace")
    report = json.loads((run_dir / "report.json").read_text())
    assert f"<title>evolane report {report['run_id']}</title>" in dom
    assert dom.count("<svg") >= 8  # every plot was laid out
    shot = tmp_path / "shot.png"
    _browse(page, tmp_path, "--window-size=1280,1800", f"--screenshot={shot}")
    width, height, scanlines = _png_pixels(shot.read_bytes())
    assert (width, height) == (1280, 1800)
    assert len(set(scanlines)) > 64  # a blank page has a handful of byte values; this has plots
    if os.environ.get("EVOLANE_SCREENSHOT"):  # how docs/report.png is made
        shutil.copyfile(shot, os.environ["EVOLANE_SCREENSHOT"])
