"""The nightly history page (steps/evidence/history.py): each regression case's trend, its noise band and the
verdict marks, as a reader sees them in a real headless browser (Debian's chromium, driven by playwright).

The store holds twelve nights of two cases. Case ``c2-128-32`` drops 10% on night09, and the confirmation rounds
of that night do not (suspicious), then drops 10% again on night11 with the confirmation rounds too (regressed);
``c4-256-64`` never changes. Nights 0-6 have fewer than ``min_history`` nights before them (insufficient data).
The browser test's screenshot is ``history.png`` in the test's tmp_path (under ``make test``:
/tmp/gauntlet-pytest-rest/test_the_page_in_a_real_browse0/history.png).
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import pytest

from conftest import require_chromium
from gauntlet.params import load_profile
from gauntlet.steps.evidence.history import HISTORY_FILE, history_series, render_html, write_history
from gauntlet.steps.evidence.results import append_rounds, read_rounds
from gauntlet.steps.gates.regress import METRICS, Options, run

NIGHTS = 12
CASES = (("vllm", "c2-128-32"), ("vllm", "c4-256-64"))


def _rows() -> list[dict]:
    rng = random.Random(3)
    rows = []
    for i in range(NIGHTS):
        for engine, case in CASES:
            base = 50.0 if case == "c2-128-32" else 80.0
            drop = 0.9 if case == "c2-128-32" and i in (9, 11) else 1.0
            phases = [("measure", drop)]
            if drop < 1:        # the suspect stage measured the case again: night09 recovers, night11 does not
                phases.append(("confirm", 1.0 if i == 9 else drop))
            for phase, d in phases:
                for rnd in range(3 if phase == "measure" else 6):
                    t = base * (1 + rng.uniform(-0.01, 0.01)) * d
                    rows.append(dict(
                        run_id=f"night{i:02d}", profile="local-cpu", engine=engine, date=f"2026-11-{i + 1:02d}",
                        timestamp=f"2026-11-{i + 1:02d}T02:{rnd:02d}:00", client="vllm-bench-serve", args_hash="h",
                        experiment="baseline", phase=phase, case=case, round=rnd + 1, valid=True,
                        output_throughput=t, request_throughput=t / 32,
                        p99_ttft_ms=300.0 * (1 + rng.uniform(-0.01, 0.01)),
                        p99_tpot_ms=40.0 * (1 + rng.uniform(-0.01, 0.01)),
                        p99_e2el_ms=1500.0 * (1 + rng.uniform(-0.01, 0.01))))
    return rows


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    uri = str(tmp_path_factory.mktemp("history") / "store")
    append_rounds(_rows(), uri)
    return uri


def _series(store: str):
    return {c.key: c for c in history_series(read_rounds(store).to_pylist())}


def test_each_night_is_marked_with_the_regress_steps_own_verdict(store, tmp_path):
    """The marks are regress's: the last night's verdict per metric is what the regress step wrote for it, and
    each earlier night's what the step would have said that night (the store's rows up to it)."""
    series = _series(store)
    assert list(series) == ["vllm/c2-128-32", "vllm/c4-256-64"]
    out = series["vllm/c2-128-32"].metrics["output_throughput"]
    assert [n.run_id for n in out] == [f"night{i:02d}" for i in range(NIGHTS)]
    verdicts = {n.run_id: n.verdict for n in out}
    assert {r for r, v in verdicts.items() if v == "insufficient data"} == {f"night{i:02d}" for i in range(7)}
    assert verdicts["night09"] == "suspicious" and verdicts["night11"] == "regressed"
    assert {verdicts[f"night{i:02d}"] for i in (7, 8, 10)} == {"no regression"}
    assert all(n.verdict == "no regression" for n in series["vllm/c4-256-64"].metrics["output_throughput"][7:])
    # the spread is the night's rounds, the point their median; the band is the one the night was judged on
    last = out[-1]
    assert last.rounds == 3 and last.low <= last.value <= last.high and last.centre == pytest.approx(50, rel=0.03)
    assert last.band is not None and last.value < last.centre - last.band
    for night in (11, 9):
        cut = tmp_path / f"cut{night}"       # the store as it was that night
        append_rounds([r for r in read_rounds(store).to_pylist() if int(r["run_id"][5:]) <= night], cut)
        opts = Options(profile=load_profile("local-cpu"), results_uri=str(cut), run_id=f"night{night:02d}")
        _, metrics = run(opts, tmp_path / f"out{night}")
        step = {(lb["case"], lb["metric"]): lb["verdict"] for lb in metrics["labels"]}
        for key, ch in series.items():
            for metric in METRICS:
                page = next(n.verdict for n in ch.metrics[metric] if n.run_id == f"night{night:02d}")
                assert page == step[(ch.case, metric)], (key, metric, night)


def test_the_page_is_self_contained():
    page = render_html(history_series(_rows()), title="t")
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page and "<link" not in page and "url(" not in page
    # a case named with markup is text on the page, not markup
    hostile = [{**r, "case": "<b>x</b>"} for r in _rows()[:3]]
    assert "<b>x</b>" not in render_html(history_series(hostile), title="t")


def test_the_profile_limits_the_page_to_its_regression_cases(store, tmp_path):
    path = write_history(tmp_path, read_rounds(store).to_pylist(), profile=load_profile("local-cpu"))
    page = path.read_text()
    assert path.name == HISTORY_FILE and 'data-case="c2-128-32"' in page and 'data-case="c4-256-64"' not in page


def _launch(p, user_data: str):
    return p.chromium.launch_persistent_context(
        user_data, executable_path="/usr/bin/chromium", headless=True, viewport={"width": 1100, "height": 900},
        args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
              "--disable-component-update", "--disable-sync", "--no-first-run"])


def test_the_page_in_a_real_browser(store, tmp_path):
    """What the morning reader sees: one section per case, a chart per metric with a mark per night, the band
    on the judged nights, the regressed and suspicious marks on the right nights, the verdict text; and the page
    asks the network for nothing. The screenshot is this test's evidence (tmp_path/history.png)."""
    require_chromium()
    from playwright.sync_api import sync_playwright

    path = write_history(tmp_path, read_rounds(store).to_pylist())
    requests: list[str] = []
    with sync_playwright() as p, tempfile.TemporaryDirectory() as user_data:
        ctx = _launch(p, user_data)
        try:
            ctx.on("request", lambda r: requests.append(r.url))
            page = ctx.new_page()
            page.goto(path.as_uri(), wait_until="load")
            assert page.title() == "Nightly history"
            sections = page.locator("section.case")
            assert sections.count() == 2
            assert [sections.nth(i).locator("h2").inner_text() for i in range(2)] == \
                ["vllm · c2-128-32", "vllm · c4-256-64"]
            for i in range(2):
                figs = sections.nth(i).locator("figure.metric")
                assert figs.count() == len(METRICS)
                for j in range(figs.count()):
                    fig = figs.nth(j)
                    assert fig.locator("circle.mark").count() == NIGHTS       # one point per night
                    assert fig.locator("rect.band").count() == NIGHTS - 7     # judged nights only
                    assert fig.locator("line.spread").count() == NIGHTS
            chart = page.locator('section[data-case="c2-128-32"] figure[data-metric="output_throughput"]')
            marks = chart.locator("circle.mark.regressed")
            assert marks.count() == 1 and marks.first.get_attribute("data-run-id") == "night11"
            assert marks.first.is_visible()
            sus = chart.locator("circle.mark.suspicious")
            assert sus.count() == 1 and sus.first.get_attribute("data-run-id") == "night09"
            assert chart.locator("circle.mark.insufficient-data").count() == 7
            # the regressed mark sits below its night's band (throughput: lower is worse), on screen
            mark_box = marks.first.bounding_box()
            band_box = chart.locator('rect.band[data-run-id="night11"]').bounding_box()
            assert mark_box and band_box and mark_box["y"] > band_box["y"] + band_box["height"]
            caption = chart.locator("figcaption").inner_text()
            assert "last night night11: regressed" in caption and "confirmed by 6 fresh rounds" in caption
            assert "suspicious night09" in caption and "not confirmed by 6 fresh rounds" in caption
            steady = page.locator('section[data-case="c4-256-64"] figure[data-metric="output_throughput"]')
            assert steady.locator(".verdict.latest").inner_text() == "no regression"
            assert steady.locator("circle.mark.regressed, circle.mark.suspicious").count() == 0
            summary = page.locator("#summary").inner_text()
            assert summary.startswith("Last night night11: 2 regressed (vllm/c2-128-32 output_throughput -")
            page.screenshot(path=str(tmp_path / "history.png"), full_page=True)
        finally:
            ctx.close()
    assert requests == [path.as_uri()]          # the page itself, nothing else
    assert (tmp_path / "history.png").stat().st_size > 10_000
    print(f"\nhistory page screenshot: {tmp_path / 'history.png'}")


def test_an_empty_store_says_so(tmp_path):
    page = render_html(history_series([]), title="t")
    assert "no measured night in the results store" in page and "No regression case to show." in page
    assert Path(write_history(tmp_path, [])).exists()
