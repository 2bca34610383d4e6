"""A stand-in for `python -m gauntlet.workflows.cli` that only writes where it was told to: a passing verdict in
``--out`` and every output parameter named in ``$FAKE_OUTPUTS`` (comma-separated) set to ``true``, so the
local runner walks every task of a real graph (tests/test_shared_rules.py) without running a gate."""

import os
import sys
from pathlib import Path

from gauntlet.contract import Check, Verdict, now_iso
from gauntlet.contract.layout import output_path


def main(argv: list[str]) -> int:
    out = Path(argv[argv.index("--out") + 1])
    v = Verdict.of(argv[1], now_iso(), [Check("ran", "pass", None, None, "fake: wrote its evidence")])
    v.write(out)
    for name in ["verdict", *filter(None, os.environ.get("FAKE_OUTPUTS", "").split(","))]:
        path = Path(output_path(out, name))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(v.status if name == "verdict" else "true")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
