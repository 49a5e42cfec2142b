"""Step traces: the recorder's bookkeeping, byte estimates, and the self-contained HTML page."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests._html import PageChecker
from verl.single_controller import trace
from verl.single_controller.trace import (
    DagTrace,
    EdgeTrace,
    NodeTrace,
    TraceRecorder,
    estimate_nbytes,
    render_html,
    write_html,
)

ERROR_TEXT = "worker died: </script><script>alert('x & y')</script> <!-- & more"


def _set_times(node: NodeTrace, t0: float, created, ready, started, finished) -> NodeTrace:
    """Give a node exact times (offsets from ``t0``), so tests can check durations to the digit."""
    node.created = t0 + created
    node.ready = None if ready is None else t0 + ready
    node.started = None if started is None else t0 + started
    node.finished = None if finished is None else t0 + finished
    return node


def _ppo_like_step(recorder: TraceRecorder, label: str, fail: bool, repeat: int = 1) -> DagTrace:
    """rollout -> (ref, reward) concurrently -> actor update; optionally the update fails mid-run.

    ``repeat`` puts that many such chains in the one step (4 nodes and 6 edges each).
    """
    dag = recorder.begin_dag(label)
    for _ in range(repeat):
        _add_chain(recorder, dag, fail)
    dag.finished = dag.started + 4.5
    recorder.end_dag(dag)
    return dag


def _add_chain(recorder: TraceRecorder, dag: DagTrace, fail: bool) -> None:
    t0 = dag.started
    gen = _set_times(recorder.add_node(dag, "rollout", "generate", "ray pid 11, 12"), t0, 0, 0, 0.1, 2.1)
    ref = _set_times(recorder.add_node(dag, "ref", "log_prob", "ray pid 13"), t0, 0, 2.1, 2.2, 3.2)
    rew = _set_times(recorder.add_node(dag, "reward", "score"), t0, 0, 2.1, 2.1, 2.6)
    upd = _set_times(recorder.add_node(dag, "actor", "update", "ray pid 11, 12"), t0, 0, 3.2, 3.3, 4.3)
    for node in (gen, ref, rew, upd):
        node.state = "done"
    if fail:
        upd.state, upd.finished, upd.error, upd.attempts = "failed", None, ERROR_TEXT, 2
    recorder.add_edge(dag, None, gen.node_id, "prompts", 1000, "cross-process")
    recorder.add_edge(dag, gen.node_id, ref.node_id, "batch", 2_000_000, "cross-process")
    recorder.add_edge(dag, gen.node_id, rew.node_id, "batch", 2_000_000, "in-process")
    recorder.add_edge(dag, ref.node_id, upd.node_id, "ref_log_prob", 4000, "cross-process")
    recorder.add_edge(dag, rew.node_id, upd.node_id, "scores", 500, "in-process")
    recorder.add_edge(dag, None, upd.node_id, "step", 8, "in-process")


@pytest.fixture
def recorder() -> TraceRecorder:
    rec = TraceRecorder()
    _ppo_like_step(rec, "step 0", fail=False)
    _ppo_like_step(rec, "step 1", fail=False)
    _ppo_like_step(rec, "step 2", fail=True)
    return rec


# ------------------------------------------------------------------------------------------------
# Recorder


def test_mark_stamps_times_in_order_and_keeps_first_start():
    rec = TraceRecorder()
    dag = rec.begin_dag("step 0")
    node = rec.add_node(dag, "actor", "update")
    assert (node.state, node.ready, node.started, node.process) == ("waiting", None, None, "driver")
    rec.mark_ready(node)
    rec.mark(node, "running")
    first_start = node.started
    rec.mark(node, "failed", error="boom")
    node.attempts += 1
    rec.mark(node, "running")  # the retry
    rec.mark(node, "done")
    rec.end_dag(dag)
    assert node.created <= node.ready <= node.started <= node.finished <= dag.finished
    assert node.started == first_start  # run time covers every attempt
    assert (node.state, node.error, node.attempts) == ("done", "boom", 2)
    with pytest.raises(ValueError, match="state"):
        rec.mark(node, "exploded")


def test_running_without_mark_ready_counts_as_ready_at_start():
    rec = TraceRecorder()
    node = rec.add_node(rec.begin_dag("s"), "ref", "log_prob")
    rec.mark(node, "running")
    assert node.ready == node.started is not None


def test_node_ids_are_unique_across_dags_and_threads():
    rec = TraceRecorder()
    dags = [rec.begin_dag(f"step {i}") for i in range(4)]

    def add_many(dag: DagTrace) -> None:
        for _ in range(200):
            node = rec.add_node(dag, "actor", "update")
            rec.mark(node, "running")
            rec.add_edge(dag, None, node.node_id, "x", 1, "in-process")

    threads = [threading.Thread(target=add_many, args=(dag,)) for dag in dags]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ids = [node.node_id for dag in dags for node in dag.nodes]
    assert len(ids) == len(set(ids)) == 800
    assert sum(len(dag.edges) for dag in dags) == 800


def test_add_edge_rejects_unknown_transport():
    rec = TraceRecorder()
    with pytest.raises(ValueError, match="transport"):
        rec.add_edge(rec.begin_dag("s"), None, 0, "batch", 1, "carrier-pigeon")


def test_role_stats_cover_run_wait_bytes_restarts_and_failures(recorder):
    stats = {(row["role"], row["method"]): row for row in recorder.role_stats()}
    update = stats[("actor", "update")]
    assert update["count"] == 3
    # two clean runs of 1.0 s, and a failed one with no finish time, which runs to the step's end (4.5)
    assert update["run_mean"] == pytest.approx((1.0 + 1.0 + 1.2) / 3)
    assert update["run_max"] == pytest.approx(1.2)
    assert update["input_wait_mean"] == pytest.approx(3.2)
    assert update["queue_wait_mean"] == pytest.approx(0.1)
    assert update["bytes_in"] == 3 * (4000 + 500 + 8)
    assert (update["restarts"], update["failures"]) == (1, 1)
    assert stats[("rollout", "generate")]["bytes_in"] == 3 * 1000
    # the table lists the largest total run time first: that is where the time goes
    assert recorder.role_stats()[0]["role"] == "rollout"


def test_role_stats_include_steps_still_running():
    rec = TraceRecorder()
    dag = rec.begin_dag("step 0")
    rec.add_node(dag, "rollout", "generate")
    assert rec.role_stats()[0]["count"] == 1
    rec.end_dag(dag)
    rec.end_dag(dag)  # a second end must not count the step twice
    assert rec.role_stats()[0]["count"] == 1


def test_memory_stays_bounded_while_statistics_cover_every_step():
    rec = TraceRecorder(max_dags=50)
    for i in range(500):
        dag = rec.begin_dag(f"step {i}")
        node = _set_times(rec.add_node(dag, "actor", "update"), dag.started, 0, 0.5, 1.0, 3.0)
        node.state = "done"
        rec.end_dag(dag)
    kept = [dag.index for dag in rec.dags]
    assert len(kept) == 50 and rec.dag_count == 500
    assert kept == sorted(kept)
    assert kept[:20] == list(range(20))  # the first steps
    assert kept[-10:] == list(range(490, 500))  # the latest steps
    middle = [i for i in kept if 20 <= i < kept[-15]]
    assert len(middle) >= 5 and len({b - a for a, b in zip(middle, middle[1:], strict=False)}) == 1  # even
    row = rec.role_stats()[0]
    assert row["count"] == 500
    assert row["run_mean"] == pytest.approx(2.0)
    assert row["input_wait_mean"] == pytest.approx(0.5)


@pytest.mark.parametrize("max_dags", [1, 2, 3, 7])
def test_tiny_max_dags_still_keeps_the_latest(max_dags):
    rec = TraceRecorder(max_dags=max_dags)
    for i in range(40):
        rec.end_dag(rec.begin_dag(f"step {i}"))
    kept = [dag.index for dag in rec.dags]
    assert len(kept) <= max_dags and kept[-1] == 39


# ------------------------------------------------------------------------------------------------
# Byte estimates


def test_estimate_nbytes_of_arrays_and_tensors():
    assert estimate_nbytes(torch.zeros(10, 4, dtype=torch.float32)) == 160
    assert estimate_nbytes(torch.zeros(3, dtype=torch.bfloat16)) == 6
    assert estimate_nbytes(np.zeros((5, 2), dtype=np.int64)) == 80
    objects = np.array([{"a": 1}, "text", None], dtype=object)
    assert estimate_nbytes(objects) == len(pickle.dumps(objects, protocol=pickle.HIGHEST_PROTOCOL))


def test_estimate_nbytes_of_dataproto_like_objects():
    fake = SimpleNamespace(
        batch={"input_ids": torch.zeros(4, 8, dtype=torch.int64), "mask": torch.ones(4, 8, dtype=torch.bool)},
        non_tensor_batch={"uid": np.arange(4, dtype=np.int32)},
    )
    assert estimate_nbytes(fake) == 4 * 8 * 8 + 4 * 8 + 4 * 4

    from verl.protocol import DataProto

    real = DataProto.from_dict(tensors={"x": torch.zeros(4, 3)}, meta_info={"temperature": 1.0})
    assert 48 < estimate_nbytes(real) < 48 + 200  # tensors plus a little pickled meta_info


def test_estimate_nbytes_of_plain_values():
    assert estimate_nbytes(None) == 0
    assert estimate_nbytes(b"12345") == 5
    assert estimate_nbytes("hello") == len(pickle.dumps("hello", protocol=pickle.HIGHEST_PROTOCOL))
    assert estimate_nbytes({"a": [1, 2, 3]}) > 0
    assert estimate_nbytes([torch.zeros(4), torch.zeros(2)]) == 24  # arrays in a list: summed, not pickled
    assert estimate_nbytes({"t": torch.zeros(4)}) >= 16
    assert estimate_nbytes(lambda: None) == 0  # unpicklable
    assert estimate_nbytes(threading.Lock()) == 0


# ------------------------------------------------------------------------------------------------
# HTML


def _check_page(page: str) -> tuple[PageChecker, dict]:
    checker = PageChecker()
    checker.feed(page)
    checker.close()
    assert checker.problems == []
    assert checker.stack == [], f"unclosed tags: {checker.stack}"
    assert page.lstrip().lower().startswith("<!doctype html>")
    data_scripts = [body for attrs, body in checker.scripts if attrs.get("id") == "trace-data"]
    assert len(data_scripts) == 1 and len(checker.scripts) == 2
    assert all(link.startswith("#") for link in checker.links), checker.links
    return checker, json.loads(data_scripts[0])


def test_page_is_self_contained_and_holds_the_trace(recorder):
    page = render_html(recorder, "run <42> & co", {"config": "ppo.yaml", "note": "<b>bold</b>"})
    checker, data = _check_page(page)
    assert "://" not in page and "http" not in page  # no network at all, not even a namespace URL
    assert "<title>run &lt;42&gt; &amp; co</title>" in page
    assert data["title"] == "run <42> & co" and data["meta"]["note"] == "<b>bold</b>"
    assert data["dag_count"] == 3 and [dag["label"] for dag in data["dags"]] == ["step 0", "step 1", "step 2"]

    last = data["dags"][-1]
    nodes = {node["role"]: node for node in last["nodes"]}
    assert {role: node["state"] for role, node in nodes.items()} == {
        "rollout": "done",
        "ref": "done",
        "reward": "done",
        "actor": "failed",
    }
    assert nodes["actor"]["error"] == ERROR_TEXT and nodes["actor"]["attempts"] == 2
    assert nodes["actor"]["finished"] is None
    assert nodes["ref"]["finished"] - nodes["ref"]["started"] == pytest.approx(1.0)  # run time
    assert nodes["ref"]["ready"] - nodes["ref"]["created"] == pytest.approx(2.1)  # waited for inputs
    # ref and reward ran at the same time
    assert (
        nodes["reward"]["started"] < nodes["ref"]["finished"]
        and nodes["ref"]["started"] < nodes["reward"]["finished"]
    )
    assert nodes["ref"]["process"] == "ray pid 13"
    edges = last["edges"]
    assert {edge["transport"] for edge in edges} == {"in-process", "cross-process"}
    assert [edge["channel"] for edge in edges if edge["src"] is None] == ["prompts", "step"]
    assert sum(edge["nbytes"] for edge in edges) == 1000 + 2 * 2_000_000 + 4000 + 500 + 8
    assert {row["method"]: row["failures"] for row in data["stats"]}["update"] == 1


def test_page_escapes_data_everywhere(recorder):
    page = render_html(recorder, "<script>alert(1)</script>", {"k": "</script><script>alert(2)</script>"})
    checker, data = _check_page(page)
    assert page.lower().count("<script") == 2  # only the page's own: the data block and the code
    data_block = page.split('id="trace-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in data_block and ">" not in data_block and "&" not in data_block
    assert "<h1>&lt;script&gt;alert(1)&lt;/script&gt;</h1>" in page  # the title is shown as text ...
    assert "<script>alert(1)</script>" in "".join(checker.text)  # ... and reads back as what was given
    assert data["dags"][-1]["nodes"][-1]["error"] == ERROR_TEXT  # and the data survives the escaping


def test_page_renders_dags_without_a_recorder_and_with_none():
    rec = TraceRecorder()
    dag = _ppo_like_step(rec, "step 0", fail=False)
    _, data = _check_page(render_html([dag], "from a list", {}))
    assert data["dag_count"] == 1 and len(data["stats"]) == 4
    _, empty = _check_page(render_html([], "empty", {}))
    assert empty["dags"] == [] and empty["stats"] == []


def test_dataclasses_round_trip_through_the_page():
    dag = DagTrace(index=7, label="hand-made", started=1.0, finished=2.0)
    dag.nodes.append(NodeTrace(node_id=3, role="driver", method="f", state="done", created=1.0, finished=1.5))
    dag.edges.append(EdgeTrace(src=None, dst=3, channel="x", nbytes=5, transport="in-process"))
    _, data = _check_page(render_html([dag], "t", {}))
    assert data["dags"][0]["nodes"][0]["node_id"] == 3 and data["dags"][0]["edges"][0]["src"] is None


def test_two_hundred_steps_stay_small():
    rec = TraceRecorder()
    for i in range(200):
        _ppo_like_step(rec, f"step {i}", fail=i % 50 == 7, repeat=3)  # 12 nodes, 18 edges a step
    assert len(rec.dags) == 200 and len(rec.dags[0].nodes) == 12
    page = render_html(rec, "big", {"config": "x" * 100})
    assert len(page.encode()) < 1_500_000


def test_write_html_replaces_the_file_atomically(recorder, tmp_path, monkeypatch):
    target = tmp_path / "out" / "trace.html"
    assert write_html(target, recorder, "run", {"a": "b"}) == target
    first = target.read_text(encoding="utf-8")
    assert "trace-data" in first and os.listdir(target.parent) == ["trace.html"]
    assert target.stat().st_mode & 0o644 == 0o644  # readable by others, unlike a bare mkstemp file

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(trace.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_html(target, TraceRecorder(), "other", {})
    assert target.read_text(encoding="utf-8") == first  # the old page is untouched ...
    assert os.listdir(target.parent) == ["trace.html"]  # ... and no temp file is left behind


# ------------------------------------------------------------------------------------------------
# A real browser, where one is installed


def _browser() -> str | None:
    return next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


def _messy_step(rec: TraceRecorder) -> DagTrace:
    """Everything the page must survive: a step still running, a failed node with no times at all, a
    waiting node, an edge from a node id that is not in the step, a cycle and a self-loop."""
    dag = rec.begin_dag("messy")
    a = rec.add_node(dag, "rollout", "generate")
    b = rec.add_node(dag, "actor", "update")
    c = rec.add_node(dag, "critic", "update")
    d = rec.add_node(dag, "driver", "log")
    rec.mark(a, "running")
    rec.mark(b, "failed", error=ERROR_TEXT)
    b.finished = None  # died with its worker: never started, never finished
    rec.mark(c, "running")
    rec.add_edge(dag, None, a.node_id, "prompts", 10, "in-process")
    rec.add_edge(dag, 12345, b.node_id, "ghost", 10, "cross-process")
    rec.add_edge(dag, b.node_id, c.node_id, "x", 10, "cross-process")
    rec.add_edge(dag, c.node_id, b.node_id, "y", 10, "in-process")
    rec.add_edge(dag, d.node_id, d.node_id, "self", 10, "in-process")
    rec.add_edge(dag, None, c.node_id, "step", 10, "in-process")
    return dag


@pytest.mark.skipif(_browser() is None, reason="no chromium / chromium-browser / google-chrome on PATH")
def test_pages_render_in_headless_chromium(recorder, tmp_path):
    one_node = TraceRecorder()
    single = one_node.begin_dag("only")
    one_node.mark(one_node.add_node(single, "driver", "f"), "done")
    one_node.end_dag(single)
    messy = TraceRecorder()
    _messy_step(messy)
    pages = {
        "main": write_html(tmp_path / "main.html", recorder, "main", {"k": "v"}),
        "empty": write_html(tmp_path / "empty.html", TraceRecorder(), "empty", {}),
        "single": write_html(tmp_path / "single.html", one_node, "single", {}),
        "messy": write_html(tmp_path / "messy.html", messy, "messy", {}),
    }
    command = [_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom"]
    runs = {
        name: subprocess.Popen(
            [*command, f"--user-data-dir={tmp_path / ('profile-' + name)}", path.as_uri()],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for name, path in pages.items()
    }
    try:
        doms = {name: run.communicate(timeout=90)[0] for name, run in runs.items()}
    finally:
        for run in runs.values():
            if run.poll() is None:
                run.kill()
    for name, dom in doms.items():
        assert 'data-rendered="ok"' in dom, (name, re.findall(r'data-rendered="[^"]*"', dom))
        assert dom.lower().count("<script") == 2, name  # no data was turned into markup

    main = doms["main"]  # opens on the latest step: four nodes, the actor update failed
    node_ids = [node.node_id for node in recorder.dags[-1].nodes]
    assert sorted(int(i) for i in re.findall(r'<g class="node[^"]*" data-node-id="(\d+)"', main)) == node_ids
    assert 'class="node state-failed critical"' in main
    assert main.count('class="edge cross-process') >= 3 and main.count('class="edge in-process') >= 3
    assert "&lt;/script&gt;&lt;script&gt;alert" in main  # the error is shown, as text
    assert "<circle cx=" in main and "driver: step" in main  # driver marker and driver stub
    assert main.count('class="bars"') == 4 and "<tbody><tr" in main

    assert doms["empty"].count('class="node') == 0 and "No steps were recorded." in doms["empty"]
    assert doms["single"].count('<g class="node') == 1
    assert doms["messy"].count('<g class="node') == 4
