"""Drawing report.html (issue 19): what the page costs at the end of a run.

Runs the sleeper example once through the CLI (``--iterations``, ``--population``), then
times, on that run's store and in this process:

- the page: `evolane.views.write_report_html` (read report.json, events.jsonl and the unit
  records, fold the events, draw, write), against the reference `render_markdown` of the
  same report plus its write (what every run already paid for report.md);
- the reducer: folding every event of the run through `ViewState`, against decoding the
  same lines (the reducer must never be what a long run's page waits for).

    python benchmarks/report_page.py [--iterations 12] [--population 4] [--rounds 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evolane.campaign import Report, StoreLayout, render_markdown
from evolane.store import read_json, write_bytes_atomic
from evolane.views import EventDecoder, ViewState, read_events, write_report_html


def best_of(rounds: int, work) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--population", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        store = Path(root) / "store"
        flags = ["--iterations", str(args.iterations), "--population", str(args.population)]
        command = [sys.executable, "-m", "evolane", "optimize", "--example", "sleeper"]
        command += ["--store", str(store), "--progress", "none", *flags]
        subprocess.run(command, check=True, capture_output=True, timeout=1800)
        layout = StoreLayout(store)
        (run_dir,) = (store / "runs").iterdir()
        blobs = layout.blobs()
        report = Report.model_validate(read_json(run_dir / "report.json"))
        events_path = run_dir / "events.jsonl"
        lines = events_path.read_bytes().splitlines()

        def page() -> None:
            write_report_html(run_dir, blobs, lambda _: None)

        def markdown() -> None:
            write_bytes_atomic(run_dir / "report.md", render_markdown(report).encode())

        def decode() -> list:
            decoder = EventDecoder(events_path, lambda _: None)
            return [decoder.decode(line, n) for n, line in enumerate(lines, 1)]

        events = list(read_events(events_path, lambda _: None))

        def fold() -> None:
            state = ViewState()
            for event in events:
                state.fold(event)

        t_page, t_md = best_of(args.rounds, page), best_of(args.rounds, markdown)
        t_fold, t_decode = best_of(args.rounds, fold), best_of(args.rounds, decode)
        size = (run_dir / "report.html").stat().st_size
        candidates = len(read_json(run_dir / "report.json")["funnel"])
        print(f"run: {candidates} candidates, {len(lines)} events, page {size / 1024:.0f} KiB")
        print(
            f"page  {t_page * 1000:8.1f} ms   report.md {t_md * 1000:6.1f} ms   "
            f"ratio {t_page / t_md:.1f}x"
        )
        print(
            f"fold  {t_fold * 1000:8.1f} ms   decode    {t_decode * 1000:6.1f} ms   "
            f"ratio {t_fold / t_decode:.2f}x"
        )


if __name__ == "__main__":
    main()
