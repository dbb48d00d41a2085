"""The CLI's allocator policy (issue 22): a fixed glibc mmap threshold gives freed large
buffers back to the kernel, where the dynamic one would keep them resident."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from evolane.supervisors import fix_mmap_threshold

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

# After one 8 MiB buffer is freed, glibc's dynamic threshold is 8 MiB: 64 buffers of 1 MiB
# then come from the heap, and once freed between live ones they stay resident.
PROBE = textwrap.dedent(
    """
    import sys
    from evolane.supervisors import fix_mmap_threshold

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    if sys.argv[1] == "fixed":
        assert fix_mmap_threshold()
    big = b"x" * (8 << 20)
    del big
    chunks = [b"c" * (1 << 20) for _ in range(64)]
    before = rss()
    del chunks[::2]  # 32 freed, each between two live ones: the heap cannot shrink
    print((before - rss()) >> 20)
    """
)


def _clean_env() -> dict[str, str]:
    """This environment without an operator's own threshold (which the policy respects)."""
    mine = ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")
    return {name: value for name, value in os.environ.items() if name not in mine}


def _returned_mib(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        capture_output=True,
        text=True,
        check=True,
        env=_clean_env(),
    )
    return int(done.stdout)


@glibc
def test_a_fixed_threshold_returns_freed_buffers_that_the_dynamic_one_keeps() -> None:
    assert _returned_mib("as-is") <= 4  # the probe shows the effect without the policy
    assert _returned_mib("fixed") >= 28


@glibc
def test_the_cli_fixes_the_threshold_for_its_own_process() -> None:
    cli_first = "import contextlib, sys\nfrom evolane.cli import main\n"
    cli_first += "sys.argv = ['evolane', '--help']\n"
    cli_first += "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(None):\n"
    cli_first += "    main()\n"
    probe = cli_first + PROBE.replace('if sys.argv[1] == "fixed":', "if False:")
    done = subprocess.run(
        [sys.executable, "-c", probe, "cli"],
        capture_output=True,
        text=True,
        check=True,
        env=_clean_env(),
    )
    assert int(done.stdout.split()[-1]) >= 28


@pytest.mark.parametrize(
    "setting",
    [
        {"MALLOC_MMAP_THRESHOLD_": "1048576"},
        {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1048576"},
    ],
)
def test_an_operators_own_threshold_is_left_alone(
    setting: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    assert fix_mmap_threshold() is False


@pytest.mark.parametrize("threshold", [0, -1, 33 * 1024 * 1024])
def test_a_threshold_out_of_range_is_refused(threshold: int) -> None:
    with pytest.raises(ValueError, match="mmap threshold"):
        fix_mmap_threshold(threshold)
