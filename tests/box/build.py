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
import fcntl
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
        ("kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler"),   # placement is the real scheduler's
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
    h.update(Path(__file__).read_bytes())        # how the box is built (flags, CRD set) is part of the pin
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
    env = {**os.environ, "GOFLAGS": "-mod=mod -buildvcs=false"}
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(cmd)}  (in {cwd})\n")
        fh.flush()
        r = subprocess.run(cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT)
    if r.returncode:
        tail = log.read_text().splitlines()[-15:]
        raise BuildError(f"`{' '.join(cmd[:3])} ...` failed in tests/box/{cwd.name} (exit {r.returncode}); "
                         f"log {log}:\n" + "\n".join(tail))


def _module_dir(go: str, module: str, cwd: Path, log: Path) -> Path:
    _run([go, "mod", "download", module], cwd, log)
    r = subprocess.run([go, "list", "-m", "-f", "{{.Dir}}", module], cwd=cwd, capture_output=True, text=True,
                       env={**os.environ, "GOFLAGS": "-mod=mod -buildvcs=false"})
    if r.returncode or not r.stdout.strip():
        raise BuildError(f"{module} not in the module cache: {r.stderr.strip()}")
    return Path(r.stdout.strip())


def _argo_modfile(argo_dir: Path, root: Path, version: str) -> Path:
    """A go.mod for tests/box/argo that builds Argo from a copy of its module with one symlink restored.

    Argo's repository has ``workflow/executor/osspecific/signal_linux.go`` as a symlink to
    ``signal_darwin.go``; a Go module zip drops symlinks, so the published module does not build
    ``argoexec`` for Linux (``undefined: Setpgid``), and ``go build -overlay`` may not touch the module
    cache. So the build copies the module (unchanged) into the box's cache, puts the symlink back, and
    points a generated modfile's ``replace`` at it. Nothing of Argo's enters the repository.
    """
    src = root / "src" / f"argo-workflows-{version}"
    link = src / "workflow" / "executor" / "osspecific" / "signal_linux.go"
    if not link.is_symlink():
        shutil.rmtree(src, ignore_errors=True)
        top = {"docs", "examples", "sdks"}     # no Go package the commands import
        shutil.copytree(argo_dir, src, symlinks=True,
                        ignore=lambda d, names: [n for n in names if Path(d) == argo_dir and n in top])
        for d in [src, *[p for p in src.rglob("*") if p.is_dir()]]:
            d.chmod(0o755)
        if not link.exists():
            link.symlink_to("signal_darwin.go")
        # the argo CLI embeds the UI's built files (ui/embed.go: dist/app), which the module does not
        # ship; Argo's own Makefile builds without the UI from a placeholder there, so does the box
        ui = src / "ui" / "dist" / "app"
        ui.mkdir(parents=True, exist_ok=True)
        (ui / "index.html").write_text("Argo UI not built (gauntlet box)\n")
    mod = (HERE / "argo" / "go.mod").read_text() + f"\nreplace {ARGO_MODULE} => {src}\n"
    modfile = root / "src" / f"argo-{version}.go.mod"
    modfile.write_text(mod)
    shutil.copyfile(HERE / "argo" / "go.sum", modfile.with_suffix(".sum"))
    return modfile


def ensure_built(verbose: bool = False) -> Binaries:
    """The box's binaries and CRDs, built only when a pin changed."""
    go = _go()
    key = _key(go)
    root = cache_root()
    final = root / key
    argo_v, k8s_v = _required("argo", ARGO_MODULE), _required("k8s", "k8s.io/kubernetes")
    names = [n for mod in MODULES.values() for n, _ in mod]
    def built() -> bool:
        return all((final / "bin" / n).is_file() for n in names) and any((final / "crds").glob("*.yaml"))

    if built():
        return Binaries(final / "bin", final / "crds", argo_v, k8s_v, 0.0)
    # several pytest workers may ask at once: one builds, the others wait for it and find it built
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".lock-{key}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if built():
            return Binaries(final / "bin", final / "crds", argo_v, k8s_v, 0.0)
        return _build(go, root, final, names, argo_v, k8s_v, key, verbose)


def _build(go: str, root: Path, final: Path, names: list[str], argo_v: str, k8s_v: str, key: str,
           verbose: bool) -> Binaries:
    t0 = time.monotonic()
    work = root / f".build-{key}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    (work / "bin").mkdir(parents=True)
    log = root / f"build-{key}.log"
    log.write_text("")
    argo_dir = _module_dir(go, ARGO_MODULE, HERE / "argo", log)
    for mod, targets in MODULES.items():
        if verbose:
            print(f"box: building {', '.join(n for n, _ in targets)} (tests/box/{mod})", file=sys.stderr, flush=True)
        # Argo builds from the box cache's copy of its module: -trimpath keeps that path out of the binaries
        extra = ["-trimpath", f"-modfile={_argo_modfile(argo_dir, root, argo_v)}"] if mod == "argo" else []
        # -s -w: no symbol table or DWARF. The code is the same; argoexec drops from 213 MB, and every Argo pod's
        # init container copies argoexec into its emptyDir (about 30 copies a scenario)
        _run([go, "build", *extra, "-ldflags=-s -w", "-o", str(work / "bin") + "/", *[p for _, p in targets]],
             HERE / mod, log)
    # Argo's CRDs come from the very module version the controller was built from. The minimal ones:
    # the full CRDs (12 MB of OpenAPI schema) take kube-apiserver minutes to publish on 2 loaded cores,
    # and the templates' structure is checked by `argo lint --offline` and the project's strict schema lint.
    src = argo_dir / "manifests" / "base" / "crds" / "minimal"
    if not src.is_dir():
        raise BuildError(f"Argo's CRDs not found in the module cache ({src})")
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
          f"{f'built in {b.built_s:.0f}s' if b.built_s else 'already built'})")
