"""`python -m box.scenario_cli step <name> ...`: the local runner's `gauntlet.workflows.cli`, with stand-ins.

The conformance tests run the local back end on the same graph as the box and replay, task by
task and attempt by attempt, what each step did on the box (exit code and output parameters),
so that both back ends judge the same leaf behaviour. ``$GAUNTLET_STANDINS`` is a JSON file
``{task path: [behaviour per attempt]}`` (the task path is the step's ``--out`` relative to the
run directory, e.g. ``sglang/smoke``; the last behaviour repeats); attempts are counted in
``$GAUNTLET_STANDINS.attempts/``. Every invocation's argv is kept as ``argv.<attempt>.json`` in
its ``--out`` (what the exit handler received is read from there). A step with no entry runs
for real.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from box import standin


def _opt(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None


def main(argv: list[str]) -> int:
    table_file = os.environ.get("GAUNTLET_STANDINS")
    run_dir = os.environ.get("GAUNTLET_RUN_DIR")
    out = _opt(argv, "--out")
    if len(argv) < 2 or argv[0] != "step" or not (table_file and run_dir and out):
        from gauntlet.workflows.cli import main as real
        return real(argv)
    path = str(Path(out).resolve().relative_to(Path(run_dir).resolve()))
    table = json.loads(Path(table_file).read_text())
    counters = Path(table_file + ".attempts")
    counters.mkdir(exist_ok=True)
    counter = counters / path.replace("/", "__")
    attempt = int(counter.read_text()) if counter.is_file() else 0
    counter.write_text(str(attempt + 1))
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"argv.{attempt}.json").write_text(json.dumps(argv))
    plays = table.get(path)
    if plays is None:
        from gauntlet.workflows.cli import main as real
        return real(argv)
    return standin.run_step(argv[1], Path(out), plays[min(attempt, len(plays) - 1)])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
