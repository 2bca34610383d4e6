"""`python -m box up [--profile kimi-k3-h20]` (``make box``): the box for interactive use.

Builds what a pin changed, starts the control plane and the process kubelet with the profile's
nodes (plus another team's GPU node and a general node), applies the profile's rendered RBAC, WorkflowTemplate and
CronWorkflow, writes a 96-shard sparse model cache on each node, and prints how to submit.
Ctrl-C stops everything. The GPU gates are played by the default stand-ins (every one passes).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m box")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start the box and keep it running until Ctrl-C")
    up.add_argument("--profile", default="kimi-k3-h20")
    up.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args(argv)

    from box.build import BuildError, ensure_built
    from box.controlplane import BoxError, ControlPlane
    from box.kubelet import ProcessKubelet, default_images
    from box.scenarios import GPU_STANDINS, BoxSession, box_nodes
    from gauntlet.params import load_profile

    if args.profile != "kimi-k3-h20":
        print("box: only the kimi-k3-h20 scenarios are wired up", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    try:
        binaries = ensure_built(verbose=True)
    except BuildError as exc:
        print(f"BuildError: {exc}", file=sys.stderr)
        return 1
    work = args.workdir or Path(tempfile.mkdtemp(prefix="gauntlet-box-"))
    cp = ControlPlane(workdir=work / "control-plane", binaries=binaries)
    try:
        cp.start()
    except BoxError as exc:
        print(f"BoxError: {exc}", file=sys.stderr)
        return 1
    profile = load_profile(args.profile)
    nodes = [n.name for n in profile.hardware.nodes]
    roots = {n: work / "kubelet" / "nodes" / n for n in nodes}
    kubelet = ProcessKubelet(cp.api_client(), workdir=work / "kubelet", host_roots=roots, **box_nodes(profile),
                             images=default_images(cp.bin_dir, cp.executor_image), standins=GPU_STANDINS)
    kubelet.start()
    session = BoxSession(cp, kubelet, roots, work / "kubelet")
    try:
        session.prepare()
        print(f"box up in {time.monotonic() - t0:.1f}s (control plane {cp.startup_s}s); "
              f"Kubernetes {binaries.kubernetes_version}, Argo {binaries.argo_version}\n"
              f"  export KUBECONFIG={cp.kubeconfig}\n"
              f"  {cp.bin_dir}/argo submit -n {profile.namespace} --from workflowtemplate/gauntlet-{profile.name} "
              f"-p engines=sglang -p results-uri=/runs/results --watch\n"
              f"  evidence: {work}/kubelet/pvc/{profile.namespace}/{profile.runs_pvc}/<workflow uid>/\n"
              "Ctrl-C stops the box.", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        session.close()
        kubelet.stop()
        cp.stop()
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
