"""Command templates (DESIGN §8): shlex split once, placeholders filled inside arguments."""

from __future__ import annotations

import pickle
import shlex
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from evolane.inputs import (
    ALL_PLACEHOLDERS,
    JUDGE_PLACEHOLDERS,
    OPTIMIZER_PLACEHOLDERS,
    REPLAY_PLACEHOLDERS,
    VERIFICATION_PLACEHOLDERS,
    CommandTemplate,
    InputError,
    TemplateError,
)
from evolane.messages import unbounded_fields

VALUES = {
    "candidate": "/runs/cand 1",
    "workspace": "/tmp/work space",
    "case_file": "/tmp/case.json",
    "output_dir": "/tmp/out dir",
    "seed": "7",
}


def replay(text: str) -> CommandTemplate:
    """``text`` parsed as a replay command."""
    return CommandTemplate.parse(text, role="replay", allowed=REPLAY_PLACEHOLDERS)


def refusal(text: str, role: str = "replay", allowed: frozenset[str] = REPLAY_PLACEHOLDERS) -> str:
    """The one-line message ``text`` is refused with."""
    with pytest.raises(TemplateError) as caught:
        CommandTemplate.parse(text, role=role, allowed=allowed)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{role} command: ")
    return message


def test_role_constants() -> None:
    assert {"candidate", "workspace", "case_file", "output_dir", "seed"} == REPLAY_PLACEHOLDERS
    assert JUDGE_PLACEHOLDERS == REPLAY_PLACEHOLDERS
    assert {"workdir", "prompt_file", "seed", "workspace"} == OPTIMIZER_PLACEHOLDERS
    assert {"workspace", "case_file", "output_dir", "seed"} == VERIFICATION_PLACEHOLDERS
    assert REPLAY_PLACEHOLDERS | OPTIMIZER_PLACEHOLDERS == ALL_PLACEHOLDERS


def test_parse_splits_once_and_records_placeholders() -> None:
    template = replay("python -m agent --case {case_file} 'two words' --seed={seed}")
    assert template.argv == (
        "python",
        "-m",
        "agent",
        "--case",
        "{case_file}",
        "two words",
        "--seed={seed}",
    )
    assert template.placeholders == {"case_file", "seed"}
    assert template.role == "replay"
    assert template.text == "python -m agent --case {case_file} 'two words' --seed={seed}"


def test_placeholders_inside_arguments() -> None:
    template = replay("run --out={output_dir}/x.json {workspace}/{seed}.log pre{seed}post")
    assert template.render(VALUES) == (
        "run",
        "--out=/tmp/out dir/x.json",
        "/tmp/work space/7.log",
        "pre7post",
    )


def test_values_with_spaces_stay_one_argument() -> None:
    template = replay("tool {candidate} {output_dir}")
    assert template.render(VALUES) == ("tool", "/runs/cand 1", "/tmp/out dir")


def test_shell_metacharacters_stay_literal() -> None:
    template = replay("echo $HOME ; ls | wc > out && $(id) `id` # not-a-comment {seed}")
    assert template.argv == (
        "echo",
        "$HOME",
        ";",
        "ls",
        "|",
        "wc",
        ">",
        "out",
        "&&",
        "$(id)",
        "`id`",
        "#",
        "not-a-comment",
        "{seed}",
    )
    nasty = "x; rm -rf ~ && echo $(id) | cat > /dev/null # *"
    assert template.render({"seed": nasty})[-1] == nasty


def test_rendered_argv_runs_without_a_shell() -> None:
    code = "import sys, json; print(json.dumps(sys.argv[1:]))"
    text = (
        f"{shlex.quote(sys.executable)} -c {shlex.quote(code)} {{case_file}} '$HOME;*' x{{{{y}}}}"
    )
    argv = replay(text).render({"case_file": "a b; $(id) *"})
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
    assert done.stdout.strip() == '["a b; $(id) *", "$HOME;*", "x{y}"]'


def test_double_braces_are_literal() -> None:
    template = replay("jq {{literal}} '{{.a}}' {{{seed}}} x}}")
    assert template.placeholders == {"seed"}
    assert template.render({"seed": "9"}) == ("jq", "{literal}", "{.a}", "{9}", "x}")
    assert replay("echo {{seed}}").placeholders == frozenset()
    assert replay("echo {{seed}}").render({}) == ("echo", "{seed}")


def test_substituted_values_are_not_expanded_again() -> None:
    template = replay("echo {candidate} {seed}")
    assert template.render({"candidate": "{seed}", "seed": "{{x}}"}) == ("echo", "{seed}", "{{x}}")


def test_unknown_placeholders_are_named_with_the_allowed_ones() -> None:
    message = refusal("run {cases} --x={bogus}")
    assert message == (
        "replay command: unknown placeholders {bogus}, {cases} "
        "(allowed: {candidate}, {case_file}, {output_dir}, {seed}, {workspace}; write {{ and }} "
        "for a literal brace, e.g. ${{HOME}} or $HOME for an environment variable)"
    )
    assert refusal("run {0}").startswith("replay command: unknown placeholder {0} (allowed:")


def test_a_placeholder_of_another_role_is_refused() -> None:
    assert refusal("run {prompt_file}") == (
        "replay command: {prompt_file} cannot be used in the replay command "
        "(allowed: {candidate}, {case_file}, {output_dir}, {seed}, {workspace})"
    )
    optimizer = refusal("opt {case_file}", role="optimizer", allowed=OPTIMIZER_PLACEHOLDERS)
    assert "(allowed: {prompt_file}, {seed}, {workdir}, {workspace})" in optimizer
    assert refusal("x {seed}", role="check", allowed=frozenset()).endswith("(allowed: none)")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("run 'unclosed", "cannot split the command: no closing quotation"),
        ('run "unclosed', "cannot split the command: no closing quotation"),
        ("run trailing\\", "cannot split the command: no escaped character"),
        ("", "the command is empty"),
        ("   \t ", "the command is empty"),
        ("'' {seed}", "the program name (first argument) is empty"),
        ("run {seed", "stray '{' in argument 2 ('{seed'); write '{{' for a literal brace"),
        ("run seed}", "stray '}' in argument 2 ('seed}'); write '}}' for a literal brace"),
        ("run {a{seed}}", "stray '{' in argument 2 ('{a{seed}}'); write '{{' for a literal brace"),
        ("run {}", "empty placeholder '{}' in argument 2 ('{}')"),
        ("run a\x00b", "the command contains a NUL character"),
        ("x" * 9000, "the command is 9000 characters long, over the 8192 limit"),
    ],
)
def test_bad_templates_are_refused_in_one_line(text: str, reason: str) -> None:
    assert refusal(text) == f"replay command: {reason}"


def test_a_multiline_template_error_is_one_line() -> None:
    message = refusal("run '{bad\nname}'")
    assert message.startswith("replay command: unknown placeholder {bad name}")


def test_render_needs_every_used_placeholder() -> None:
    template = replay("run {seed} {case_file} {workspace}")
    with pytest.raises(TemplateError) as caught:
        template.render({"workspace": "w"})
    assert str(caught.value) == "replay command: no value given for {case_file}, {seed}"
    assert template.render({**VALUES, "unused": "x"}) == (
        "run",
        "7",
        "/tmp/case.json",
        "/tmp/work space",
    )
    with pytest.raises(TemplateError, match=r"the value for \{seed\} contains a NUL"):
        template.render({**VALUES, "seed": "a\x00"})
    with pytest.raises(TypeError):
        template.render({**VALUES, "seed": 7})  # type: ignore[dict-item]


def test_errors_are_input_errors_and_pickle() -> None:
    with pytest.raises(InputError) as caught:
        replay("run {nope}")
    error = caught.value
    assert isinstance(error, TemplateError) and isinstance(error, ValueError)
    assert (
        error.role == "replay" and error.reason is not None and error.reason.startswith("unknown")
    )
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.role, copy.reason) == (str(error), error.role, error.reason)


def test_template_is_a_bounded_consistent_record() -> None:
    template = replay("run {workspace} {seed} {case_file}")
    assert unbounded_fields(CommandTemplate) == []
    dumped = template.model_dump_json()
    assert '"placeholders":["case_file","seed","workspace"]' in dumped
    assert CommandTemplate.model_validate_json(dumped) == template
    with pytest.raises(ValidationError):
        CommandTemplate(text="run {seed}", argv=("run", "7"), placeholders=frozenset({"seed"}))
    with pytest.raises(ValidationError):
        CommandTemplate(text="run {seed}", argv=("run", "{seed}"), placeholders=frozenset())
    direct = CommandTemplate(text="run {seed}", argv=("run", "{seed}"), placeholders={"seed"})
    assert direct.render({"seed": "1"}) == ("run", "1")
    with pytest.raises(TypeError):
        template.model_construct()


_literal = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20
)


@settings(max_examples=200, deadline=None)
@given(_literal, _literal, _literal, st.sampled_from(sorted(REPLAY_PLACEHOLDERS)))
def test_any_value_lands_verbatim_inside_its_argument(
    prefix: str, suffix: str, value: str, name: str
) -> None:
    def escape(text: str) -> str:
        return text.replace("{", "{{").replace("}", "}}")

    arg = escape(prefix) + "{" + name + "}" + escape(suffix)
    template = replay(shlex.join(["prog", arg, escape(suffix)]))
    assert template.placeholders == {name}
    assert template.render({name: value}) == ("prog", prefix + value + suffix, suffix)
