"""vLLM across nodes on the real vLLM CPU build: rank 1's `vllm serve ... --headless` joins and opens no API port.

The two "nodes" are two process groups on this machine, on loopback: the argvs are
:func:`gauntlet.steps.engines.commands.engine_command`'s for ranks 0 and 1 of a two-node placement (so rank 1
carries ``--headless``), with the local-cpu profile's engine spec changed only where one CPU machine needs it:
the model is split by layers (``--pipeline-parallel-size 2``: SmolLM2-135M's 9 attention heads rule out
tensor parallelism over 2) and the workers run under vLLM's multiprocessing executor (``mp``; the profile's
in-process ``uni`` executor holds one worker only). What it proves: the leader serves only once the headless
rank's workers joined its torch.distributed group and loaded their half of the layers, nothing listens on
the port given to rank 1 while it runs, and rank 0 listens on its own. It does not send a completion: on the
CPU build, vLLM 0.32's pipeline-parallel worker on the second node fails its first step
(``sync_and_gather_intermediate_tensors``: AssertionError; docs/cluster.md "vLLM across nodes"), a CPU
limitation of the model runner, not of the headless start. GPUs and two real hosts are not here.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil
import pytest

from gauntlet.params import load_profile
from gauntlet.steps.engines.local_vllm import LocalEngine, free_port, group_members
from gauntlet.steps.engines.commands import Placement, engine_command, engine_env

from conftest import require_vllm

pytestmark = [pytest.mark.engine, pytest.mark.slow]
STARTUP_S = 480.0     # two ranks' start-up with the box's scenarios beside it on two cores


def _listening(pgid: int) -> set[int]:
    """TCP ports the process group listens on."""
    ports: set[int] = set()
    for pid in group_members(pgid):
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        ports |= {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}
    return ports


def _anyone_listens(port: int) -> bool:
    return any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
               for c in psutil.net_connections(kind="tcp"))


def test_headless_rank_opens_no_api_port_while_the_leader_serves(tmp_path: Path, local_model: Path) -> None:
    require_vllm()
    profile = load_profile("local-cpu")
    spec = profile.engines["vllm"]
    args = spec.args.model_copy(update={"extra": {**spec.args.extra, "distributed-executor-backend": "mp",
                                                  "pipeline-parallel-size": 2}})
    ports, master = [free_port(), free_port()], free_port()
    # the in-process engine core (VLLM_ENABLE_V1_MULTIPROCESSING=0) goes with the uni executor only
    env = {k: v for k, v in engine_env("vllm", spec).items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    ranks = []
    for r in (0, 1):
        s = spec.model_copy(update={"args": args, "port": ports[r]})
        argv = engine_command("vllm", s, model_path=str(local_model), served_name=profile.model.served_name,
                              python=sys.executable, host="127.0.0.1",
                              placement=Placement(nnodes=2, node_rank=r, dist_addr=f"127.0.0.1:{master}"))
        ranks.append(LocalEngine(argv, ports[r], profile.model.served_name, tmp_path / f"rank{r}.log", env=env,
                                 startup_timeout_s=STARTUP_S))
    leader, worker = ranks
    assert worker.argv[1:3] == ["serve", str(local_model)] and "--headless" in worker.argv
    assert "--headless" not in leader.argv
    t0 = time.monotonic()
    try:
        worker.start()
        leader.launch()          # ready: /v1/models lists the model, after both ranks' workers loaded
        ready_s = time.monotonic() - t0
        assert worker.alive(), (tmp_path / "rank1.log").read_text()[-3000:]
        log1 = (tmp_path / "rank1.log").read_text()
        assert "headless multiproc executor" in log1 and "Starting vLLM server" not in log1
        assert ports[0] in _listening(leader.pgid)
        listened = _listening(worker.pgid)
        assert listened, "the headless rank's workers listen for their torch.distributed peers"
        assert ports[1] not in listened and not _anyone_listens(ports[1])
        print(f"\nheadless: leader ready in {ready_s:.0f}s; rank 1 listens on {sorted(listened)}, "
              f"not on its --port {ports[1]}", file=sys.stderr)
    finally:
        for e in (leader, worker):
            e.stop()
    assert not group_members(worker.pgid) and not group_members(leader.pgid)
