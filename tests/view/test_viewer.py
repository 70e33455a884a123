"""`agentrl view` in a real headless Chromium, on the run of a real short `agentrl train`.

The bug story: a viewer that colours a token by the wrong mask or version shows a correct
stream where the data is wrong (or the reverse), which is worse than no viewer. So the
colours are read back from the DOM — each token's computed background against the legend's
swatch for what the file says the token is — and compared, token by token, with the
trajectory file. The export must open from file:// with the network off and ask for nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

AGENTRL = Path(sys.executable).parent / "agentrl"
ROOT = Path(__file__).resolve().parents[2]


def read_step(run_dir: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "trajectories" / f"step_{step:06d}.jsonl").read_text().splitlines()]


def expected_roles(mask: list[int]) -> list[str]:
    """prompt before the first sampled token, sampled where the loss mask is 1, env/tool output elsewhere."""
    first = mask.index(1) if 1 in mask else len(mask)
    return ["sampled" if m else "prompt" if i < first else "env" for i, m in enumerate(mask)]


def gap_indices(row: dict, threshold: float) -> list[int]:
    return [i for i, (m, b, t) in enumerate(zip(row["loss_mask"], row["logprobs"], row["trainer_logprobs"], strict=True))
            if m and i > 0 and abs(b - t) > threshold]


def interruptions(row: dict) -> list[int]:
    """Where the version changes inside a run of sampled tokens (a generation resumed after an update)."""
    m, v = row["loss_mask"], row["versions"]
    return [i for i in range(1, len(m)) if m[i] and m[i - 1] and v[i] != v[i - 1]]


TOKENS_JS = """() => [...document.querySelectorAll('#tokens .tok')].map(s => ({
  i: +s.dataset.i, pos: +s.dataset.pos, mask: +s.dataset.mask, version: +s.dataset.version, role: s.dataset.role,
  bg: getComputedStyle(s).backgroundColor, text: s.textContent, gap: s.classList.contains('gap')}))"""
LEGEND_JS = """() => Object.fromEntries([...document.querySelectorAll('#legend .key')].map(k =>
  [k.dataset.value, getComputedStyle(k.querySelector('.sw')).backgroundColor]))"""
CUTS_JS = """() => [...document.querySelectorAll('#tokens .vcut')].map(c => +c.nextElementSibling.dataset.i)"""


def open_trajectory(page, url: str, step: int, index: int) -> None:
    page.goto(f"{url}/#t/0/{step}/{index}")
    page.wait_for_selector("#tokens .tok")


def check_tokens(page, row: dict) -> None:
    """Every token's role colour and version colour match the file's loss mask and versions."""
    page.select_option("#colour-by", "role")
    page.wait_for_function("() => document.querySelector('#colour-by').value === 'role'")
    dom, legend = page.evaluate(TOKENS_JS), page.evaluate(LEGEND_JS)
    n = len(row["input_ids"])
    assert [d["i"] for d in dom] == list(range(n))
    assert [d["mask"] for d in dom] == row["loss_mask"]
    assert [d["version"] for d in dom] == row["versions"]
    assert [d["text"] for d in dom] == [t.replace("\n", "↵") for t in row["tokens"]]
    roles = expected_roles(row["loss_mask"])
    assert set(legend) == {"prompt", "sampled", "env"} and len(set(legend.values())) == 3
    assert [d["bg"] for d in dom] == [legend[r] for r in roles]
    assert [d["role"] for d in dom] == roles
    assert [d["i"] for d in dom if d["gap"]] == gap_indices(row, 0.5)
    assert page.evaluate(CUTS_JS) == interruptions(row)

    page.select_option("#colour-by", "version")
    page.wait_for_function("() => document.querySelector('#colour-by').value === 'version'")
    dom, legend = page.evaluate(TOKENS_JS), page.evaluate(LEGEND_JS)
    sampled_versions = sorted({v for v, m in zip(row["versions"], row["loss_mask"], strict=True) if m})
    assert set(legend) == {"-1", *map(str, sampled_versions)}
    assert len(set(legend.values())) == len(legend)  # one colour per version
    assert [d["bg"] for d in dom] == [legend[str(v) if m else "-1"]
                                      for v, m in zip(row["versions"], row["loss_mask"], strict=True)]


def test_the_page_shows_the_curves_and_the_trained_tokens(trained_run, serve_view, page, artifacts):
    run_dir, _ = trained_run
    url = serve_view(run_dir)
    html = page.request.get(url + "/").text()
    for external in ("<script src", "<link", "@import", "url(", "https://", "cdn"):
        assert external not in html.lower(), external  # nothing outside the page itself

    page.goto(url + "/#curves")
    page.wait_for_selector('.chart[data-keys~="rollout/reward_mean"] svg polyline', state="attached")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in metrics if "rollout/reward_mean" in m]
    reward = page.locator('.chart[data-keys~="rollout/reward_mean"] svg circle')
    assert reward.count() == 2 * len(trained)  # reward_mean and success_rate, one point a step
    for key in ("train/loss", "train/clip_frac", "train/behaviour_weight_mean", "batch/staleness_mean",
                "perf/generation_tokens_per_s", "perf/trainer_idle_fraction", "eval/pass@1"):
        assert page.locator(f'.chart[data-keys~="{key}"] svg polyline').count() >= 1, key
    assert page.locator('.chart[data-keys="staleness/*"] svg rect').count() >= len(trained)
    page.hover('.chart[data-keys~="rollout/reward_mean"] svg', position={"x": 60, "y": 80})
    assert "step" in page.inner_text("#tip")
    page.screenshot(path=str(artifacts / "viewer-curves.png"), full_page=True)

    # a step's trajectories, grouped by GRPO group, searchable
    step = 3
    rows = read_step(run_dir, step)
    page.goto(f"{url}/#steps/0/{step}")
    page.wait_for_selector("table.rows tr.link")
    assert page.locator("tr.link").count() == len(rows)
    assert page.locator(".group").count() == len({r["group_id"] for r in rows})
    question = "".join(rows[0]["tokens"][: rows[0]["loss_mask"].index(1)])
    needle = question.split("What is ")[1].split("?")[0] if "What is " in question else rows[0]["tokens"][3]
    page.fill("#search", needle)
    expected = sum(needle.lower() in "".join(r["tokens"]).lower() for r in rows)
    page.wait_for_function(f"() => document.querySelectorAll('tr.link').length === {expected}")
    page.fill("#search", "no such text anywhere")
    page.wait_for_selector("text=No trajectory passes the filters.")
    page.fill("#search", "")

    # one trajectory, token by token
    page.click("tr.link >> nth=1")
    page.wait_for_selector("#tokens .tok")
    assert page.url.endswith(f"#t/0/{step}/1")
    check_tokens(page, rows[1])
    sampled = rows[1]["loss_mask"].index(1)
    page.hover(f'#tokens .tok[data-i="{sampled}"]')
    tip = page.inner_text("#tip")
    assert str(rows[1]["input_ids"][sampled]) in tip and "behaviour log p" in tip and "trainer log p" in tip
    advantage = page.locator("text=advantage").first
    assert advantage.count() == 1
    events = page.locator("#env-record details.record-event summary")  # the episode's environment record
    assert [events.nth(i).inner_text() for i in range(events.count())] == [
        "reset", f"generate · {sum(rows[1]['loss_mask'])} tokens · seed none",
        f"step · reward {rows[1]['reward']:g} · terminated"]
    page.select_option("#colour-by", "role")
    page.screenshot(path=str(artifacts / "viewer-trajectory.png"), full_page=True)
    for i, row in enumerate(rows):
        open_trajectory(page, url, step, i)
        check_tokens(page, row)


REWARD_POINTS = '.chart[data-keys~="rollout/reward_mean"] svg circle'


def live_copy(src: Path, run_dir: Path) -> list[str]:
    """A run directory that looks like ``src`` after its first step; returns src's metrics lines."""
    (run_dir / "trajectories").mkdir(parents=True)
    shutil.copy(src / "config.yaml", run_dir)
    lines = (src / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run_dir / "metrics.jsonl").write_text("".join(line for line in lines if json.loads(line)["step"] <= 1))
    shutil.copy(src / "trajectories" / "step_000001.jsonl", run_dir / "trajectories")
    return lines


def write_step(run_dir: Path, lines: list[str], step: int) -> None:
    with (run_dir / "metrics.jsonl").open("a") as f:  # what the run appends after that step
        f.write("".join(line for line in lines if json.loads(line)["step"] == step))


def wait_for_points(page, n: int, timeout_ms: int) -> None:
    """Until the reward chart has ``n`` points; a timeout says what the page shows instead."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(f"() => document.querySelectorAll('{REWARD_POINTS}').length === {n}", timeout=timeout_ms)
    except PlaywrightTimeout:
        raise AssertionError(f"expected {n} reward points within {timeout_ms} ms; the page has "
                             f"{page.locator(REWARD_POINTS).count()}, status {page.inner_text('#status')!r}") from None


def watch_live_copy(src: Path, run_dir: Path, serve_view, page) -> tuple[list[str], str]:
    """``agentrl view`` on a live copy of ``src`` after its first step, its curves open in ``page``;
    returns src's metrics lines and the viewer's URL."""
    lines = live_copy(src, run_dir)
    url = serve_view(run_dir)
    page.goto(url + "/#curves")
    page.wait_for_selector(REWARD_POINTS)
    assert page.locator(REWARD_POINTS).count() == 2
    return lines, url


def test_new_steps_appear_without_a_reload(trained_run, serve_view, page, tmp_path):
    src, _ = trained_run
    run_dir = tmp_path / "live"
    lines, url = watch_live_copy(src, run_dir, serve_view, page)
    assert "live" in page.inner_text("#status")

    write_step(run_dir, lines, 2)
    wait_for_points(page, 4, 15_000)

    page.goto(url + "/#steps")
    page.wait_for_selector("text=Step 1")
    shutil.copy(src / "trajectories" / "step_000002.jsonl", run_dir / "trajectories" / "tmp")
    (run_dir / "trajectories" / "tmp").rename(run_dir / "trajectories" / "step_000002.jsonl")
    page.wait_for_selector("h2 >> text=Step 2", timeout=15_000)  # followed, no reload
    assert page.locator("tr.link").count() == len(read_step(run_dir, 2))


def test_a_slow_link_draws_each_step_once(trained_run, serve_view, page, tmp_path):
    """The bug: the page polled on a fixed 2 s timer, so on a link slower than that (a viewer
    through an SSH tunnel; a loaded CI host) two polls asked for the same new rows and step 2
    was drawn twice (6 points, not 4). Every request is delayed 2.5 s here by Chromium's own
    network emulation."""
    src, _ = trained_run
    run_dir = tmp_path / "live"
    lines, _ = watch_live_copy(src, run_dir, serve_view, page)
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send("Network.emulateNetworkConditions", {"offline": False, "latency": 2500, "downloadThroughput": -1,
                                                  "uploadThroughput": -1})
    write_step(run_dir, lines, 2)
    page.wait_for_function(f"() => document.querySelectorAll('{REWARD_POINTS}').length >= 4", timeout=30_000)
    page.wait_for_timeout(8_000)  # a poll's two requests take 5 s: more polls come and go, none may add a point
    assert page.locator(REWARD_POINTS).count() == 4


def test_two_runs_compared_on_the_same_axes(trained_run, serve_view, page, tmp_path):
    src, _ = trained_run
    other = tmp_path / "eta0"
    shutil.copytree(src, other, ignore=shutil.ignore_patterns("checkpoints", "weights", "tensorboard"))
    url = serve_view(src, "--compare", other)
    page.goto(url + "/#curves")
    page.wait_for_selector('.chart[data-keys~="train/loss"] svg polyline', state="attached")
    assert page.locator("#runs-legend .run").all_inner_texts() == [src.name, "eta0"]
    lines = page.locator('.chart[data-keys~="train/loss"] svg polyline')
    dashes = [lines.nth(i).get_attribute("stroke-dasharray") for i in range(lines.count())]
    assert dashes.count(None) == 2 and dashes.count("6 4") == 2  # loss, policy_loss: solid for one run, dashed for the other


def made_up_run(trained_run, tmp_path) -> tuple[Path, list[dict]]:
    """A run of one step whose rows are real rows changed by hand: the first with a weight
    update in the middle of its completion, the second with hostile token text."""
    src, _ = trained_run
    rows = read_step(src, 3)[:2]
    first = rows[0]
    sampled = [i for i, m in enumerate(first["loss_mask"]) if m]
    cut = sampled[len(sampled) // 2]
    first["versions"] = [v + 1 if i >= cut and m else v for i, (v, m) in enumerate(zip(first["versions"], first["loss_mask"], strict=True))]
    hostile = '</script><img src=x onerror="window.pwned=1"><!--'
    rows[1]["tokens"][2] = hostile
    run_dir = tmp_path / "made-up"
    (run_dir / "trajectories").mkdir(parents=True)
    shutil.copy(src / "config.yaml", run_dir)
    (run_dir / "trajectories" / "step_000004.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir, rows


def test_a_resumed_generation_is_marked_and_token_text_stays_text(trained_run, serve_view, page, tmp_path):
    run_dir, rows = made_up_run(trained_run, tmp_path)
    url = serve_view(run_dir)
    open_trajectory(page, url, 4, 0)
    assert page.evaluate(CUTS_JS) == interruptions(rows[0]) and len(interruptions(rows[0])) == 1
    check_tokens(page, rows[0])
    open_trajectory(page, url, 4, 1)
    assert page.evaluate("() => window.pwned") is None
    assert page.locator('#tokens .tok[data-i="2"]').inner_text() == rows[1]["tokens"][2]


def export(run_dir: Path, out: Path, *args: str) -> dict:
    done = subprocess.run([str(AGENTRL), "view", str(run_dir), "--export", str(out), *args],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def long_run(trained_run, tmp_path) -> tuple[Path, list[dict]]:
    """A made-up run whose trajectories are long: each real row of step 3 repeated 12 times."""
    src, _ = trained_run
    rows = read_step(src, 3)
    for row in rows:
        for key in ("input_ids", "loss_mask", "logprobs", "versions", "tokens", "trainer_logprobs", "entropy"):
            row[key] = row[key] * 12
    run_dir = tmp_path / "long"
    (run_dir / "trajectories").mkdir(parents=True)
    shutil.copy(src / "config.yaml", run_dir)
    (run_dir / "trajectories" / "step_000003.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir, rows


def test_the_export_opens_offline_and_asks_for_nothing(trained_run, playwright_driver, chromium, tmp_path, artifacts):
    run_dir, _ = trained_run
    whole = export(run_dir, tmp_path / "report.html")
    assert whole["notes"] == [] and whole["bytes"] == (tmp_path / "report.html").stat().st_size
    long_dir, long_rows = long_run(trained_run, tmp_path)
    full = export(long_dir, tmp_path / "long-full.html")
    bound = int(full["bytes"] * 0.75)  # too small for everything: the longest trajectories are cut
    small = export(long_dir, tmp_path / "long.html", "--max-mb", str(bound / 2**20))
    assert (tmp_path / "long.html").stat().st_size <= bound
    assert any("cut to" in note for note in small["notes"]), small["notes"]

    # the network is off: a proxy that answers nothing, and the context offline
    browser = playwright_driver.chromium.launch(executable_path=chromium, headless=True,
                                                args=["--proxy-server=127.0.0.1:9"])
    try:
        context = browser.new_context(offline=True, viewport={"width": 1400, "height": 900})
        page = context.new_page()
        requests: list[str] = []
        errors: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto((tmp_path / "report.html").as_uri() + "#curves")
        page.wait_for_selector('.chart[data-keys~="rollout/reward_mean"] svg polyline', state="attached")
        assert "offline copy" in page.inner_text("#status")
        rows = read_step(run_dir, 2)
        page.goto((tmp_path / "report.html").as_uri() + "#t/0/2/0")
        page.wait_for_selector("#tokens .tok")
        check_tokens(page, rows[0])

        page.goto((tmp_path / "long.html").as_uri() + "#steps")
        page.wait_for_selector("table.rows tr.link")
        assert page.locator("#notes div").count() == len(small["notes"])
        page.click("tr.link >> nth=0")
        page.wait_for_selector("#tokens .tok")
        cut = page.locator("#tokens .cut-note").inner_text()
        total = len(long_rows[0]["input_ids"])
        assert f"the trajectory has {total}" in cut
        dom = page.evaluate(TOKENS_JS)
        positions = [d["pos"] for d in dom]  # where each shown token sits in the whole trajectory
        head = next(k for k, p in enumerate(positions) if p != k)
        assert positions == list(range(head)) + list(range(total - (len(dom) - head), total))
        assert [d["mask"] for d in dom] == [long_rows[0]["loss_mask"][p] for p in positions]
        assert [d["version"] for d in dom] == [long_rows[0]["versions"][p] for p in positions]
        page.screenshot(path=str(artifacts / "viewer-export.png"), full_page=True)
        assert not errors, errors
        assert requests and all(u.startswith("file://") for u in requests), requests
    finally:
        browser.close()


@pytest.fixture
def eval_run(trained_run, tiny_server, tmp_path):
    """``agentrl eval`` on the trained run's config (against the shared server), into a copy."""
    src, _ = trained_run
    run_dir = tmp_path / "evaluated"
    run_dir.mkdir()
    shutil.copy(src / "config.yaml", run_dir)
    done = subprocess.run([str(AGENTRL), "eval", str(src / "config.yaml"), f"run_dir={run_dir}",
                           f"inference.servers=[{tiny_server.url}]", "eval.limit=6", "eval.sampling.temperature=1.0",
                           "--k", "3", "--samples", "2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return run_dir, json.loads(done.stdout.strip().splitlines()[-1])


def test_the_output_of_agentrl_eval(eval_run, serve_view, page):
    run_dir, report = eval_run
    problems = [json.loads(line) for line in (run_dir / "eval" / "eval.jsonl").read_text().splitlines()]
    assert all(len({s["sample"] for s in p["samples"]}) == 2 for p in problems)
    url = serve_view(run_dir)
    page.goto(url + "/#eval/0")
    page.wait_for_selector("tr[data-problem]")
    assert page.locator("tr[data-problem]").count() == 6
    pass1 = page.locator(".fact", has_text="pass@1").locator(".v").inner_text()
    assert float(pass1) == pytest.approx(report["pass@1"], abs=1e-3)
    pass3 = page.locator(".fact", has_text="pass@3").locator(".v").inner_text()
    assert float(pass3) == pytest.approx(report["pass@3"], abs=1e-3)
    page.click("tr[data-problem] a.badge >> nth=0")
    page.wait_for_selector("#tokens .tok")
    first = sorted(problems, key=lambda p: p["index"])[0]["samples"][0]
    dom = page.evaluate(TOKENS_JS)
    assert [d["mask"] for d in dom] == first["loss_mask"] and [d["version"] for d in dom] == first["versions"]


BROKEN = ["rollout.dataset=flaky_arith:rows", "eval.dataset=flaky_arith:rows", "rollout.workflow_args.env_id=test/BrokenArith-v0"]
"""tests/run/flaky_arith.py: an Arith-v0 whose every step raises (every episode fails)."""


def broken_env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "run"), os.environ.get("PYTHONPATH", "")])}


def test_a_run_whose_episodes_fail_shows_the_error_where_one_looks(serve_view, page, tmp_path):
    """Issue 31: every episode of a run failed, and the viewer said "0 of 0 trajectories" with the
    error nowhere. Now the banner counts the failures and gives the first error, and the step
    lists the failed episodes with their error."""
    run_dir = tmp_path / "failing"
    done = subprocess.run([str(AGENTRL), "train", "examples/arith_grpo.yaml", f"run_dir={run_dir}", *BROKEN, "steps=1",
                           "eval.dataset=null", "rollout.batch_size=2", "rollout.group_size=4", "max_minutes=null",
                           "checkpoint.every_steps=0", "logging.tensorboard=false", "logging.trajectories_per_step=4"],
                          cwd=ROOT, env=broken_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    rows = read_step(run_dir, 1)
    assert len(rows) == 4 and {r["status"] for r in rows} == {"env_error"}  # failed ones, since none was trained on
    page.goto(serve_view(run_dir))
    page.wait_for_selector("#notes .failures")
    note = page.inner_text("#notes")
    assert "8 of 8 episodes failed (env_error 8)." in note, note
    assert "First error: env_error: RuntimeError: the broken env broke on purpose" in note, note
    page.click("#notes a:has-text('See them at step 1')")
    page.wait_for_selector("tr[data-index]")
    assert page.locator("tr[data-index]").count() == 4
    assert all("the broken env broke on purpose" in t for t in page.locator("tr[data-index] td.error").all_inner_texts())
    assert page.locator("tr[data-index] .badge.bad", has_text="env_error").count() == 4
    assert "4 of 4 trajectories (4 failed, not trained on)" in page.inner_text(".toolbar")


@pytest.fixture(scope="module")
def failing_eval(tiny_server, tmp_path_factory):
    """``agentrl eval --out DIR`` of an env whose every step raises: (DIR, completed process)."""
    out = tmp_path_factory.mktemp("failing-eval") / "eval-only"
    done = subprocess.run([str(AGENTRL), "eval", "examples/arith_grpo.yaml", *BROKEN, "eval.limit=4", "--k", "2",
                           "--out", str(out), f"inference.servers=[{tiny_server.url}]", "eval.sampling.temperature=1.0"],
                          cwd=ROOT, env=broken_env(), capture_output=True, text=True, timeout=300)
    return out, done


def test_agentrl_eval_whose_episodes_all_fail_exits_1_saying_why(failing_eval):
    """Issue 31: `agentrl eval` exited 0 with scores of 0 when every episode failed."""
    out, done = failing_eval
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "agentrl eval: 8 of 8 episodes failed; the scores measure the failures" in done.stderr, done.stderr[-2000:]
    assert "The first error: env_error: RuntimeError: the broken env broke on purpose" in done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["failed_episodes"] == 8 and report["first_error"].startswith("env_error: RuntimeError: the broken")
    assert json.loads((out / "eval_summary.json").read_text()) == report
    problems = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert all(p["failed"] == 2 and "the broken env broke on purpose" in p["error"] for p in problems)


def test_an_evaluation_folder_opens_on_its_evaluation_and_its_failures(failing_eval, serve_view, page):
    """Issue 31: the viewer on an `agentrl eval --out DIR` folder landed on an empty Curves tab
    marked "watching" after the evaluation had finished. It opens on the Evaluation tab, says
    "finished", and shows the failed episodes' errors."""
    out, _ = failing_eval
    page.goto(serve_view(out))
    page.wait_for_selector("body[data-ready='eval'] tr[data-problem]")
    assert page.locator("nav#tabs a.on").inner_text() == "Evaluation"
    assert page.inner_text("#status").startswith("finished")
    assert "evaluation: 8 of 8 episodes failed. First error: env_error: RuntimeError: the broken env" in \
        page.inner_text("#notes")
    assert page.locator("tr[data-problem]").count() == 4
    assert all("the broken env broke on purpose" in t for t in page.locator("tr[data-problem] td.error").all_inner_texts())
    page.goto(page.url.split("#")[0] + "#curves")
    page.wait_for_selector("body[data-ready='curves']")
    assert "holds an evaluation (`agentrl eval`), not a training run" in page.inner_text("#view")


SEGMENTS_JS = """() => [...document.querySelectorAll('#tokens .turn')].map(s =>
  [s.dataset.role, s.dataset.kind || '', s.textContent])"""


def test_feedback_turns_tool_calls_and_tool_results_are_labelled_apart_from_model_text(trained_run, serve_view,
                                                                                        page, tmp_path):
    """Issue 25: a multi-turn stream shows which segments the model wrote and was trained on, and
    what each env segment is — a tool's result or a user turn such as "Too low. Try again." —
    read from the chat template's own role markers. The streams are the tiny model's template
    rendered and masked as a rollout records them (agentrl sft's conversation_examples)."""
    import random

    from agentrl.model.arith_data import make_problem
    from agentrl.rollout.renderer import ChatRenderer
    from agentrl.run.sft_data import conversation_examples
    from examples.tool_agent import conversation as tool_conversation

    renderer = ChatRenderer(str(ROOT / "examples" / "tiny-model"))
    feedback = [{"role": "user", "content": "What is 10+20+36?"}, {"role": "assistant", "content": "\\boxed{64}"},
                {"role": "user", "content": "Too low. The answer ends in 6. Try again."},
                {"role": "assistant", "content": "\\boxed{66}"}]
    calc = tool_conversation(make_problem("37*48"), random.Random(0))
    src, _ = trained_run
    rows = read_step(src, 3)[:2]
    for row, conv in zip(rows, ({"messages": feedback}, calc), strict=True):
        (example,) = conversation_examples(renderer, conv["messages"], conv.get("tools"))
        n = len(example.input_ids)
        row.update(input_ids=example.input_ids, loss_mask=example.loss_mask,
                   tokens=[renderer.tokenizer.decode([i]) for i in example.input_ids],
                   versions=[0 if m else -1 for m in example.loss_mask], logprobs=[0.0] * n,
                   trainer_logprobs=[0.0] * n, entropy=[0.0] * n, num_turns=2)
    run_dir = tmp_path / "multi-turn"
    (run_dir / "trajectories").mkdir(parents=True)
    shutil.copy(src / "config.yaml", run_dir)
    (run_dir / "trajectories" / "step_000001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    url = serve_view(run_dir)

    open_trajectory(page, url, 1, 0)
    check_tokens(page, rows[0])
    assert page.evaluate(SEGMENTS_JS) == [
        ["prompt", "", "prompt"], ["sampled", "", "turn 1 · sampled by the policy · trained"],
        ["env", "user turn", "env · user turn · not trained"], ["sampled", "", "turn 2 · sampled by the policy · trained"]]
    open_trajectory(page, url, 1, 1)
    check_tokens(page, rows[1])
    assert page.evaluate(SEGMENTS_JS) == [
        ["prompt", "", "prompt"], ["sampled", "tool call", "turn 1 · sampled by the policy · tool call · trained"],
        ["env", "tool result", "env · tool result · not trained"],
        ["sampled", "", "turn 2 · sampled by the policy · trained"]]
