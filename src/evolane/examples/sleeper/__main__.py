"""``python -m evolane.examples.sleeper``: the sleeper's command line."""

from evolane.examples.sleeper.commands import main

raise SystemExit(main())
