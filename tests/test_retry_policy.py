"""The retry rule has one owner (graph.retry_policy): render's retryStrategy/timeout and the local runner's
attempts and ``failures`` follow it. A gate that never exits 75 gets no retryStrategy on Argo, so Argo's
``failures`` lists its pod node under the step's own name, never ``name(0)`` (seen on the box:
gate0-corrupt-model's preflight-1)."""

from __future__ import annotations

import json

from gauntlet.params import load_profile
from gauntlet.steps import needs_of
from gauntlet.workflows.graph import EXIT_BACKOFF, RETRY_LIMIT, build_graph, retry_policy
from gauntlet.workflows.local import TaskResult, argo_failures


def _tasks():
    g = build_graph(load_profile("kimi-k3-h20"), "argo")
    return [t for d in g.dags for t in d.tasks if t.step] + [g.exit_handler]


def test_policy_follows_the_gates_needs():
    tasks = _tasks()
    assert {t.step for t in tasks if retry_policy(t) is None} == {t.step for t in tasks
                                                                  if not needs_of(t.step).transient}
    assert any(retry_policy(t) is None for t in tasks) and any(retry_policy(t) for t in tasks)
    for t in tasks:
        p = retry_policy(t)
        if p is not None:
            assert p.limit == RETRY_LIMIT
            assert (p.backoff == EXIT_BACKOFF) == (t.gate == "exit")


def _names(raw: str) -> set[str]:
    return {n["displayName"] for n in json.loads(json.loads(raw))}


def test_failures_name_attempt_nodes_only_for_a_retried_step():
    once = TaskResult("preflight-1", "preflight-1", "0", "preflight", "Failed", attempts=[1], retried=False)
    retried = TaskResult("sglang/smoke", "smoke", "3", "smoke", "Failed", attempts=[75, 1], retried=True)
    assert _names(argo_failures([once], "wf", "Failed")) == {"preflight-1", "wf"}
    assert _names(argo_failures([retried], "wf", "Failed")) == {"smoke(0)", "smoke(1)", "smoke", "wf"}
