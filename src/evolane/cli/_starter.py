"""The starter project ``evolane init`` writes: a greeting "agent" whose skill is a table of
greetings, a dataset of people to greet in six languages (train / val / test), a replay, a
judge and an optimizer script, and the ``evolane.toml`` that runs them.

The seed skill knows English only; the judge says what it expected; the optimizer reads the
judge's reasons on the train cases it is shown and adds one missing greeting per candidate,
so each accepted candidate fixes a language on val (cases it never saw) as well. Everything
is the Python standard library, deterministic, and runs in seconds.
"""

from __future__ import annotations

import json

GREETINGS = {
    "en": "Hello",
    "fr": "Bonjour",
    "de": "Hallo",
    "es": "Hola",
    "it": "Ciao",
    "nl": "Hoi",
}
NAMES = ("Ada", "Alan", "Grace", "Edsger", "Barbara", "Donald", "Frances")
SPLITS = (("train", 2), ("val", 3), ("test", 2))
"""Cases per language in each split (train 12, val 18, test 12)."""

SKILL = """\
# How the agent greets someone: one line per language code, "code = greeting".
# A language with no line gets the default. evolane's optimizer adds the missing ones.
default = Hello
en = Hello
"""

REPLAY = '''\
"""Replay: the agent greets one person in their language, as its skill says.

evolane runs it as: python3 replay.py {candidate} {case_file} {output_dir}
Replace it with a script that runs YOUR agent on the case, with the candidate's files.
"""

import json
import sys
from pathlib import Path

candidate, case_file, output_dir = sys.argv[1:4]
case = json.loads(Path(case_file).read_text())  # no expected_output: only the judge sees it
person = case["input"]
table = {}
for line in (Path(candidate) / "greetings.txt").read_text().splitlines():
    code, sep, word = line.partition("=")
    if sep and not line.lstrip().startswith("#"):
        table[code.strip()] = word.strip()
word = table.get(person["lang"], table.get("default", "Hello"))
Path(output_dir, "output.json").write_text(json.dumps(f"{word}, {person['name']}!"))
'''

JUDGE = '''\
"""Judge: scores one replay, and says why when it is wrong (the optimizer reads the reason).

evolane runs it as: python3 judge.py {case_file} {output_dir}
It prints {"score": <0..1>, "reason": "..."} on stdout.
"""

import json
import sys
from pathlib import Path

case = json.loads(Path(sys.argv[1]).read_text())  # the judge's copy has expected_output
try:
    answer = json.loads(Path(sys.argv[2], "output.json").read_text())
except (OSError, ValueError):
    answer = None
expected = case["expected_output"]
right = answer == expected
reason = "" if right else f"expected {json.dumps(expected)}, got {json.dumps(answer)}"
print(json.dumps({"score": 1.0 if right else 0.0, "reason": reason}))
'''

OPTIMIZER = '''\
"""Optimizer: edits the skill in its working folder (a copy of the parent's).

evolane runs it as: python3 optimize.py {prompt_file}, in {workdir}.
It reads the failing train cases and the judge's reasons, learns the greeting of one
language the skill gets wrong (a different one per slot) and adds it. Its first printed
line is the candidate's summary. Replace it with your own (or --optimizer agent:NAME).
"""

import json
import os
import re
import sys
from pathlib import Path

prompt = json.loads(Path(sys.argv[1]).read_text())
context = Path(os.environ["EVOLANE_CONTEXT_DIR"])  # read-only: the failing cases, as replayed
learned = {}
for failing in prompt.get("failing", []):
    match = re.match(r'expected "([^",]+), ', failing.get("reason") or "")
    case_file = context / "cases" / failing["id"] / "case.json"
    if match and case_file.is_file():
        lang = json.loads(case_file.read_text())["input"]["lang"]
        learned.setdefault(lang, match.group(1))
if not learned:
    print("nothing left to learn")
    sys.exit(0)
langs = sorted(learned)
lang = langs[prompt.get("slot", 0) % len(langs)]
with open("greetings.txt", "a") as skill:
    skill.write(f"{lang} = {learned[lang]}\\n")
print(f"learned the {lang} greeting: {learned[lang]}")
'''


def dataset_rows() -> list[dict[str, object]]:
    """The dataset: every language in every split, each case one person to greet; no two
    cases share an input (a person greeted in one language once), so no val or test case
    is a train case under another id (the preflight warns of that)."""
    rows: list[dict[str, object]] = []
    people = iter(range(10_000))
    greeted = dict.fromkeys(GREETINGS, 0)
    for split, per_language in SPLITS:
        for lang, word in GREETINGS.items():
            for _ in range(per_language):
                index = next(people)
                name = NAMES[greeted[lang] % len(NAMES)]
                greeted[lang] += 1
                rows.append(
                    {
                        "id": f"{lang}-{index:02d}",  # no split: a replay sees the id
                        "input": {"name": name, "lang": lang},
                        "expected_output": f"{word}, {name}!",
                        "split": split,
                    }
                )
    return rows


def dataset_text() -> str:
    """The dataset as JSONL."""
    return "".join(json.dumps(row) + "\n" for row in dataset_rows())


def config_text(scripts: str, python: str = "python3") -> str:
    """``evolane.toml`` for scripts in the absolute folder ``scripts``, run by ``python``:
    the flags of ``evolane optimize`` (paths relative to the file's folder; templates name
    absolute paths, since every command runs in a fresh folder of its own)."""
    return f"""\
# evolane.toml: the flags of `evolane optimize`, without their dashes (a flag given on the
# command line wins). Paths are relative to this file's folder.
target = "skill"
dataset = "dataset.jsonl"
store = ".evolane"
replay = "{python} {scripts}/replay.py {{candidate}} {{case_file}} {{output_dir}}"
judge = "{python} {scripts}/judge.py {{case_file}} {{output_dir}}"
optimizer = "{python} {scripts}/optimize.py {{prompt_file}}"
iterations = 2
population = 2
"""
