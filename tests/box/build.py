"""Build the box's binaries from the Go module proxy, once per pinned version.

Two Go modules hold the pins: ``tests/box/k8s`` (``k8s.io/kubernetes`` with its
staging modules replaced by the published releases, plus a small embedded-etcd
main of ours) and ``tests/box/argo`` (``github.com/argoproj/argo-workflows/v4``
and its CLI ``cmd/argo``, whose ``lint --offline`` is Argo's own validator). ``go build <package>`` builds
the upstream commands straight from the module cache: no upstream code is copied
into the repository and no binary is committed.

Outputs go to ``$GAUNTLET_BOX_CACHE`` (default ``~/.cache/gauntlet-box``) under a
key made of the Go version and every go.mod, go.sum and .go file of the two
modules: a rebuild with nothing changed finds the binaries and returns at once;
changing a pin builds a new directory. Argo's CRDs are copied from the same
module version at build time.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Binaries", "ensure_built", "cache_root", "BuildError", "MODULES"]

HERE = Path(__file__).resolve().parent
ARGO_MODULE = "github.com/argoproj/argo-workflows/v4"
# module dir -> (binary name, package) built from it
MODULES: dict[str, tuple[tuple[str, str], ...]] = {
    "k8s": (
        ("etcd", "./etcd"),
        ("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"),
        ("kube-controller-manager", "k8s.io/kubernetes/cmd/kube-controller-manager"),
    ),
    "argo": (
        ("workflow-controller", f"{ARGO_MODULE}/cmd/workflow-controller"),
        ("argoexec", f"{ARGO_MODULE}/cmd/argoexec"),
        ("argo", f"{ARGO_MODULE}/cmd/argo"),        # the real CLI: submit, stop, terminate, lint --offline
    ),
}


class BuildError(RuntimeError):
    """The box could not be built; the message says which step and why."""


@dataclass(frozen=True)
class Binaries:
    bin_dir: Path
    crd_dir: Path
    argo_version: str
    kubernetes_version: str
    built_s: float            # 0 when everything was already there

    def path(self, name: str) -> Path:
        return self.bin_dir / name


def cache_root() -> Path:
    return Path(os.environ.get("GAUNTLET_BOX_CACHE") or Path.home() / ".cache" / "gauntlet-box")


def _go() -> str:
    go = shutil.which("go")
    if not go:
        raise BuildError("no `go` on PATH: the box is built with Go >= 1.26 from the Go module proxy")
    return go


def _key(go: str) -> str:
    h = hashlib.sha256()
    h.update(subprocess.run([go, "version"], capture_output=True, text=True, check=True).stdout.encode())
    for mod in sorted(MODULES):
        for f in sorted((HERE / mod).rglob("*")):
            if f.is_file() and (f.suffix == ".go" or f.name in ("go.mod", "go.sum")):
                h.update(str(f.relative_to(HERE)).encode())
                h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _required(mod: str, module: str) -> str:
    for line in (HERE / mod / "go.mod").read_text().splitlines():
        parts = line.replace("require", "").split()
        if len(parts) >= 2 and parts[0] == module:
            return parts[1]
    raise BuildError(f"tests/box/{mod}/go.mod does not require {module}")


def _run(cmd: list[str], cwd: Path, log: Path) -> None:
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(cmd)}  (in {cwd})\n")
        fh.flush()
        r = subprocess.run(cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT)
    if r.returncode:
        tail = log.read_text().splitlines()[-15:]
        raise BuildError(f"`{' '.join(cmd[:3])} ...` failed in tests/box/{cwd.name} (exit {r.returncode}); "
                         f"log {log}:\n" + "\n".join(tail))


def ensure_built(verbose: bool = False) -> Binaries:
    """The box's binaries and CRDs, built only when a pin changed."""
    go = _go()
    key = _key(go)
    root = cache_root()
    final = root / key
    argo_v, k8s_v = _required("argo", ARGO_MODULE), _required("k8s", "k8s.io/kubernetes")
    names = [n for mod in MODULES.values() for n, _ in mod]
    if all((final / "bin" / n).is_file() for n in names) and any((final / "crds").glob("*.yaml")):
        return Binaries(final / "bin", final / "crds", argo_v, k8s_v, 0.0)
    t0 = time.monotonic()
    work = root / f".build-{key}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    (work / "bin").mkdir(parents=True)
    log = root / f"build-{key}.log"
    log.write_text("")
    for mod, targets in MODULES.items():
        if verbose:
            print(f"box: building {', '.join(n for n, _ in targets)} (tests/box/{mod})", file=sys.stderr, flush=True)
        _run([go, "build", "-trimpath", "-o", str(work / "bin") + "/", *[p for _, p in targets]], HERE / mod, log)
    # Argo's CRDs come from the very module version the controller was built from.
    mod_dir = subprocess.run([go, "list", "-m", "-f", "{{.Dir}}", ARGO_MODULE], cwd=HERE / "argo",
                             capture_output=True, text=True, env={**os.environ, "GOFLAGS": "-mod=mod"})
    src = Path(mod_dir.stdout.strip()) / "manifests" / "base" / "crds" / "full"
    if mod_dir.returncode or not src.is_dir():
        raise BuildError(f"Argo's CRDs not found in the module cache ({mod_dir.stderr.strip() or src})")
    (work / "crds").mkdir()
    for f in sorted(src.glob("argoproj.io_*.yaml")):
        shutil.copyfile(f, work / "crds" / f.name)
    shutil.rmtree(final, ignore_errors=True)
    work.rename(final)
    return Binaries(final / "bin", final / "crds", argo_v, k8s_v, round(time.monotonic() - t0, 1))


if __name__ == "__main__":
    try:
        b = ensure_built(verbose=True)
    except BuildError as exc:
        print(f"BuildError: {exc}", file=sys.stderr)
        sys.exit(1)
    print(f"box binaries in {b.bin_dir} (Kubernetes {b.kubernetes_version}, Argo {b.argo_version}; "
          f"{'built in %.0fs' % b.built_s if b.built_s else 'already built'})")
