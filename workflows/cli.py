"""`gauntlet`: a thin CLI over the graph, the renderers, the linter and the steps.

Every command validates the profile first. Errors print as ``Type: message``
and exit non-zero (2 for bad input); there is no traceback for bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import traceback
from pathlib import Path
from collections.abc import Iterator
from typing import NoReturn

from gauntlet.contract import GauntletError, UsageError, exit_code_of
from gauntlet.params import load_profile, profile_path
from gauntlet.steps import STEPS, GateImportError, load_step, needs_of
from gauntlet.steps.options import add_options

__all__ = ["main", "build_parser"]


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (``UsageError: gauntlet render: ...``), exit 2; subcommand
    parsers inherit it."""

    def error(self, message: str) -> NoReturn:
        message = message.replace("\n", "\\n")
        message = message if len(message) <= 300 else message[:297] + "..."
        self.exit(2, f"UsageError: {self.prog}: {message} (see {self.prog} --help)\n")


def _add_profile(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--profile", required=required,
                   help="profile name in params/profiles/ (e.g. kimi-k3-h20, local-cpu) or a YAML path")


def _add_allow_unverified(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-unverified-images", action="store_true",
                   help="render a cluster profile whose images are pinned by stand-in digests (params/images.yaml "
                        "verified: false; also $GAUNTLET_ALLOW_UNVERIFIED_IMAGES=1); the template's "
                        "gauntlet.dev/unverified-images annotation names them")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="gauntlet", description=(
        "Gated validation pipeline for serving a large model: render it to Argo, "
        "run it locally, or run one gate."))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("render", help="render the WorkflowTemplate, CronWorkflow and RBAC (offline) and lint them")
    _add_profile(p)
    p.add_argument("--out", default="build", help="output directory (default: build)")
    p.add_argument("--no-lint", action="store_true", help="skip the strict lint after rendering")
    _add_allow_unverified(p)

    p = sub.add_parser("plan", help="the run's schedule: each task's estimate against its deadline, the GPUs it "
                       "holds and the GPU-hours spent when it ends, with the assumptions (docs/plan.md)")
    _add_profile(p)
    p.add_argument("--json", action="store_true", help="the plan as JSON")
    p.add_argument("--run", choices=("both", "qualification", "nightly"), default="both",
                   help="which run's plan: the qualification, the nightly, or both (the default)")

    p = sub.add_parser("lint", help="strictly validate rendered files (DIR) or a profile and what it renders")
    p.add_argument("dir", nargs="?", help="directory (or file) of rendered YAML to lint")
    _add_profile(p, required=False)
    _add_allow_unverified(p)

    p = sub.add_parser("submit", help="create/update the templates on Argo, or print the argo commands")
    _add_profile(p)
    p.add_argument("--host", help="Argo server URL, e.g. https://argo.example:2746")
    p.add_argument("--token", help="bearer token (or set ARGO_TOKEN)")
    p.add_argument("--namespace", help="namespace (default: the profile's)")
    p.add_argument("--dry-run", action="store_true", help="print the exact argo CLI commands instead")
    p.add_argument("--out", default="build", help="where rendered files are written (default: build)")
    p.add_argument("--verify-ssl", action=argparse.BooleanOptionalAction, default=True)
    _add_allow_unverified(p)

    p = sub.add_parser("run", help="run the gate graph locally (the embedded default back end)")
    _add_profile(p)
    p.add_argument("--runs-dir", default="runs", help="where runs/<run-id>/ is written (default: runs)")
    p.add_argument("--run-id", help="run id (default: a timestamp)")
    p.add_argument("--engines", default=None, help="sglang, vllm or both (default: the profile's engines)")
    p.add_argument("--gates", default=None, help="comma-separated gate names to run (default: all)")
    p.add_argument("--run", choices=("qualification", "nightly"), default="qualification",
                   help="the qualification (every gate, the default) or the nightly (the scheduled regression run: "
                        "Gate 0, smoke, the nightly cases, regress, report)")

    p = sub.add_parser("janitor", help="release what finished or killed runs left running (--backend local: engines "
                       "of dead runners under --runs-dir; else the cluster, as the gauntlet-janitor CronWorkflow does)")
    p.add_argument("--out", default=None, help="evidence directory (default: <runs-dir>/.janitor/<time>)")
    add_options(load_step("janitor").Options, p)        # the gate's own flags: --backend, --runs-dir, --grace, ...

    p = sub.add_parser("report", help="write report.md and plots for a run directory")
    p.add_argument("run_dir", help="runs/<run-id>/")
    p.add_argument("--results", default=None, help="results store URI for the nightly trend")

    p = sub.add_parser("model", help="local model helpers")
    msub = p.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    mp = msub.add_parser("prepare", help="build a local model directory (e.g. smollm2)")
    mp.add_argument("name", help="recipe name, e.g. smollm2")
    mp.add_argument("--cache", default=None, help="cache directory (default: .cache/models)")
    mp = msub.add_parser("synth", help="write a synthetic model directory with a profile's structure")
    _add_profile(mp)
    mp.add_argument("--out", required=True)
    mp.add_argument("--sparse", action="store_true", help="full-size sparse shards (headers only)")

    p = sub.add_parser("step", help="run one gate (what each Argo container runs)")
    ssub = p.add_subparsers(dest="step", required=True, metavar="GATE")
    wanted = None
    if argv is not None and len(argv) >= 2 and argv[0] == "step":
        wanted = argv[1]  # import only the step being run; --help lists all
    for name in STEPS:
        if wanted is not None and wanted in STEPS and name != wanted:
            ssub.add_parser(name)
            continue
        try:
            mod = load_step(name)
        except GateImportError:
            if name == wanted:
                raise           # the gate being run: a crash with its traceback (main), not "invalid choice"
            ssub.add_parser(name, help="(its module does not import: run `gauntlet step " + name + "` to see why)")
            continue
        sp = ssub.add_parser(name, help=mod.HELP, description=mod.HELP)
        if needs_of(mod).profile:
            _add_profile(sp, required=False)
        sp.add_argument("--out", default=f"evidence/{name}", help="evidence directory (default: evidence/<gate>)")
        add_options(mod.Options, sp)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        parser = build_parser(argv)
    except GateImportError as exc:
        # a broken gate module is a crash (a bug or a broken image), never a usage error: the traceback
        # goes to the log, then one line naming the gate and the cause
        traceback.print_exception(exc.__cause__ or exc, file=sys.stderr)
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return exit_code_of(exc)
    args = parser.parse_args(argv)
    try:
        return _dispatch(args)
    except (GauntletError, KeyboardInterrupt) as exc:
        print(f"{type(exc).__name__}: {exc}" if isinstance(exc, GauntletError) else "interrupted", file=sys.stderr)
        return exit_code_of(exc)
    except OSError as exc:
        if args.command == "step":
            raise           # a gate's own errors are its verdict's business (steps/runner.py)
        # a path the user gave that cannot be written or read (--out is a file, no permission): one line
        print(f"UsageError: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 2


@contextlib.contextmanager
def _naming_the_file(profile_arg: str) -> Iterator[None]:
    """A profile that validated but cannot render (its plan over a deadline, a timeouts_s key naming no task):
    the one-line error names the profile's file too."""
    try:
        yield
    except UsageError as exc:
        raise type(exc)(f"{exc} (profile {profile_path(profile_arg)})") from None


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "step":
        from gauntlet.steps.runner import run_step
        return run_step(load_step(args.step), args)
    if args.command == "render":
        from gauntlet.workflows.render import render_profile
        profile = load_profile(args.profile)
        with _naming_the_file(args.profile):
            paths = render_profile(profile, Path(args.out), allow_unverified=args.allow_unverified_images)
        for p in paths:
            print(p)
        if args.no_lint:
            return 0
        import yaml
        from gauntlet.workflows.lint import lint_paths, print_findings, profile_rules
        named = [(p.name, d) for p in paths for d in yaml.safe_load_all(p.read_text()) if d is not None]
        return print_findings(lint_paths(paths) + profile_rules(profile, named))
    if args.command == "plan":
        import json

        from gauntlet.workflows.graph import RUNS
        from gauntlet.workflows.plan import format_plans, plan_profile
        profile = load_profile(args.profile)
        plans = [plan_profile(profile, r) for r in RUNS if args.run in ("both", r)]
        if args.json:
            print(json.dumps({p.run: p.to_dict() for p in plans}, indent=2) if args.run == "both"
                  else json.dumps(plans[0].to_dict(), indent=2))
        else:
            print(format_plans(plans))
        return 0
    if args.command == "lint":
        from gauntlet.workflows.lint import lint_paths, lint_profile, print_findings
        if args.dir is None and args.profile is None:
            raise UsageError("lint: give a DIR of rendered files or --profile")
        findings = []
        if args.profile:
            profile = load_profile(args.profile)
            with _naming_the_file(args.profile):
                findings += lint_profile(profile, allow_unverified=args.allow_unverified_images)
        if args.dir:
            d = Path(args.dir)
            if not d.exists():
                raise UsageError(f"lint: {d}: no such file or directory")
            findings += lint_paths(sorted(d.glob("*.yaml")) if d.is_dir() else [d])
        return print_findings(findings)
    if args.command == "submit":
        from gauntlet.workflows.submit import submit
        return submit(load_profile(args.profile), out=Path(args.out), namespace=args.namespace, host=args.host,
                      token=args.token, dry_run=args.dry_run, verify_ssl=args.verify_ssl,
                      allow_unverified=args.allow_unverified_images)
    if args.command == "run":
        from gauntlet.workflows.local import run_local
        return run_local(load_profile(args.profile), profile_path(args.profile), runs_dir=Path(args.runs_dir),
                         run_id=args.run_id, engines=args.engines,
                         gates=set(args.gates.split(",")) if args.gates else None, run=args.run)
    if args.command == "janitor":
        from datetime import datetime, UTC

        from gauntlet.steps.runner import run_step
        if args.out is None:
            args.out = str(Path(args.runs_dir) / ".janitor" / datetime.now(UTC).strftime("%Y%m%d-%H%M%S"))
        args.profile = None
        return run_step(load_step("janitor"), args)
    if args.command == "report":
        from gauntlet.steps.evidence.report import write_report
        write_report(Path(args.run_dir), results=args.results)
        return 0
    if args.command == "model":
        if args.model_command == "prepare":
            from gauntlet.steps.model.local import prepare
            print(prepare(args.name, cache=args.cache))
            return 0
        if args.model_command == "synth":
            from gauntlet.steps.model.synth import synth_from_profile
            print(synth_from_profile(load_profile(args.profile), Path(args.out), sparse=args.sparse))
            return 0
    raise UsageError(f"unknown command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
