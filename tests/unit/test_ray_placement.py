"""The pure parts of a Ray worker group: local ranks, how placements read, the heartbeats' bookkeeping."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("ray")

from verl.single_controller.ray_placement import local_ranks, ranks_text  # noqa: E402


def test_local_ranks_count_the_ranks_on_each_node_in_rank_order():
    nodes = {0: ("a", "10.0.0.1"), 1: ("a", "10.0.0.1"), 2: ("b", "10.0.0.2"), 3: ("a", "10.0.0.1")}
    local, sizes = local_ranks(nodes)
    assert local == {0: 0, 1: 1, 2: 0, 3: 2}
    assert sizes == {0: 3, 1: 3, 2: 1, 3: 3}


def test_one_node_gives_local_rank_equal_to_rank():
    local, sizes = local_ranks({r: ("n", "127.0.0.1") for r in range(4)})
    assert local == {0: 0, 1: 1, 2: 2, 3: 3} and set(sizes.values()) == {4}


@pytest.mark.parametrize(
    "ranks, text",
    [([3], "rank 3"), ([0, 1], "ranks 0,1"), ([0, 1, 2], "ranks 0-2"), ([0, 2, 5], "ranks 0,2,5")],
)
def test_ranks_read_as_a_range_when_contiguous(ranks, text):
    assert ranks_text(ranks) == text


# ---------------------------------------------------------------- the heartbeats' bookkeeping


class _Ping:
    def __init__(self, rank: int, answers: set[int]) -> None:
        self.rank, self.answers = rank, answers


class _Actor:
    def __init__(self, rank: int, answers: set[int]) -> None:
        self.ping = type("Method", (), {"remote": lambda _self: _Ping(rank, answers)})()


def test_a_rank_is_silent_only_once_up_and_after_a_ping_unanswered_for_the_timeout(monkeypatch):
    from verl.single_controller import ray_watchdog

    answers: set[int] = {0, 1, 2}  # the ranks whose processes answer pings right now
    monkeypatch.setattr(
        ray_watchdog.ray,
        "wait",
        lambda refs, num_returns, timeout: ([r for r in refs if r.rank in r.answers], []),
    )
    clock = [100.0]
    monkeypatch.setattr(ray_watchdog.time, "monotonic", lambda: clock[0])
    beats = ray_watchdog.Heartbeats([_Actor(r, answers) for r in range(4)], timeout_s=30, started=[0, 1])
    assert beats.interval_s == 10 and beats.next_due == 110
    assert beats.beat([0, 1, 2, 3]) == []  # pings out to all four
    answers.discard(1)  # rank 1 stops before answering that ping; rank 3 never answers (still starting)
    answers.discard(3)
    clock[0] = 110
    assert beats.beat([0, 1, 2, 3]) == []  # ranks 0 and 2 answered and get new pings; rank 1's is 10 s old
    clock[0] = 129.5
    assert beats.beat([0, 1, 2, 3]) == []
    clock[0] = 130
    assert beats.beat([0, 1, 2, 3]) == [
        1
    ]  # 30 s unanswered: silent; rank 3, never up, is left to the deadline
    clock[0] = 400
    assert beats.beat([0, 2]) == [1]  # one ping in flight per rank: rank 1 got no second one
    assert sum(1 for rank, _ in beats._in_flight.values() if rank == 1) == 1


def test_restarted_hosts_wait_until_ray_drops_a_lost_node(monkeypatch):
    """After a node is lost Ray still lists it until its health checks time out, and would place new hosts
    there; a restart (``on_alive_nodes``) waits until the listed nodes are the answering ones, one rank or many."""
    from verl.single_controller import ray_placement

    listed = [{"NodeID": "a"}, {"NodeID": "b"}]
    answering = {"a"}
    events = []

    def alive_nodes():
        events.append("asked")
        if events.count("asked") == 3:  # Ray's verdict comes on the third look
            listed.pop()
        return list(listed)

    class FakeHost:
        @staticmethod
        def options(**options):
            return SimpleNamespace(remote=lambda sys_path: events.append("host") or object())

    monkeypatch.setattr(ray_placement, "alive_nodes", alive_nodes)
    monkeypatch.setattr(ray_placement, "raylet_answers", lambda node: node["NodeID"] in answering)
    monkeypatch.setattr(ray_placement.time, "sleep", lambda s: None)
    monkeypatch.setattr(ray_placement, "HostActor", FakeHost)
    hosts = ray_placement.Hosts(world_size=1, num_cpus=1)
    assert events == ["host"]  # a first start places at once
    events.clear()
    hosts.start(on_alive_nodes=True)
    assert events == ["asked", "asked", "asked", "host"]
