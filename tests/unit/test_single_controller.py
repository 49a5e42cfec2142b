import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.single_controller import Dispatch, DispatchError, LocalWorkerGroup, Worker, WorkerError, register
from verl.single_controller.dispatch import (
    DISPATCH_MODES,
    collect_dp_compute_proto,
    dispatch_all_to_all,
    dispatch_dp_compute_proto,
    dispatch_one_to_all,
    register_dispatch_mode,
)
from verl.single_controller.worker import worker_placement


class ToyWorker(Worker):
    def __init__(self, scale: float = 2.0) -> None:
        # rank / world_size must already be set here
        self.seen_at_init = (self.rank, self.world_size)
        self.scale = scale

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto, offset: float = 0.0) -> DataProto:
        n = len(data)
        return DataProto.from_dict(
            tensors={"x": data.batch["x"] * self.scale + offset},
            non_tensors={"rank": [self.rank] * n, "uid": data.non_tensor_batch["uid"].tolist()},
            meta_info={"from_rank": self.rank},
        )

    @register()
    def whoami(self, tag: str) -> tuple[int, int, str]:
        return (self.rank, self.world_size, tag)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def route(self, item: str, *, suffix: str) -> str:
        return f"rank{self.rank}:{item}{suffix}"

    def helper(self) -> int:  # not registered
        return 42


def batch7() -> DataProto:
    return DataProto.from_dict(
        tensors={
            "x": torch.tensor(
                [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0], [8.0, 9.0], [10.0, 11.0], [12.0, 13.0]]
            )
        },
        non_tensors={"uid": ["a", "b", "c", "d", "e", "f", "g"]},
    )


# ---------------------------------------------------------------- the group


def test_group_builds_ranked_workers_before_init():
    group = LocalWorkerGroup(ToyWorker, world_size=3, init_kwargs={"scale": 2.0})
    assert len(group) == 3
    assert [w.seen_at_init for w in group.workers] == [(0, 3), (1, 3), (2, 3)]
    assert [w.rank for w in group.workers] == [0, 1, 2]


def test_dp_compute_proto_pads_splits_and_unpads():
    group = LocalWorkerGroup(ToyWorker, world_size=3)
    out = group.double(batch7())
    assert isinstance(out, DataProto)
    assert len(out) == 7
    expected = torch.tensor(
        [[0.0, 2.0], [4.0, 6.0], [8.0, 10.0], [12.0, 14.0], [16.0, 18.0], [20.0, 22.0], [24.0, 26.0]]
    )
    assert torch.equal(out.batch["x"], expected)
    assert out.non_tensor_batch["uid"].tolist() == ["a", "b", "c", "d", "e", "f", "g"]
    # 7 rows padded to 9: ranks 0 and 1 get 3 real rows, rank 2 gets "g" plus 2 padding rows
    assert out.non_tensor_batch["rank"].tolist() == [0, 0, 0, 1, 1, 1, 2]
    assert out.meta_info == {"from_rank": 0}  # concat keeps the first chunk's meta_info


def test_dp_compute_proto_passes_non_dataproto_args_to_all():
    group = LocalWorkerGroup(ToyWorker, world_size=3)
    out = group.double(batch7(), offset=1.0)
    assert out.batch["x"][:, 0].tolist() == [1.0, 5.0, 9.0, 13.0, 17.0, 21.0, 25.0]


def test_dp_compute_proto_with_fewer_rows_than_workers():
    group = LocalWorkerGroup(ToyWorker, world_size=3)
    data = DataProto.from_dict(tensors={"x": torch.tensor([[1.0], [2.0]])}, non_tensors={"uid": ["p", "q"]})
    out = group.double(data)
    assert out.batch["x"].tolist() == [[2.0], [4.0]]
    assert out.non_tensor_batch["rank"].tolist() == [0, 1]


def test_dp_compute_proto_world_size_one_is_identity_split():
    group = LocalWorkerGroup(ToyWorker, world_size=1)
    out = group.double(batch7())
    assert out.non_tensor_batch["rank"].tolist() == [0] * 7
    assert out.batch["x"][-1].tolist() == [24.0, 26.0]


def test_one_to_all_returns_one_result_per_worker():
    group = LocalWorkerGroup(ToyWorker, world_size=3)
    assert group.whoami("hi") == [(0, 3, "hi"), (1, 3, "hi"), (2, 3, "hi")]


def test_all_to_all_routes_element_i_to_rank_i():
    group = LocalWorkerGroup(ToyWorker, world_size=3)
    out = group.route(["a", "b", "c"], suffix=["!", "?", "."])
    assert out == ["rank0:a!", "rank1:b?", "rank2:c."]


def test_all_to_all_wrong_length_names_method_and_lengths():
    group = LocalWorkerGroup(ToyWorker, world_size=3)
    with pytest.raises(DispatchError) as info:
        group.route(["a", "b"], suffix=["!", "?", "."])
    message = str(info.value)
    assert "ToyWorker.route" in message and "ALL_TO_ALL" in message
    assert "world_size=3" in message and "length 2" in message
    with pytest.raises(DispatchError, match="keyword argument 'suffix' is a str"):
        group.route(["a", "b", "c"], suffix="!")


def test_unregistered_method_raises_helpful_attribute_error():
    group = LocalWorkerGroup(ToyWorker, world_size=2)
    with pytest.raises(AttributeError, match=r"ToyWorker\.helper is not exposed.*@register"):
        group.helper()
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        group.nonexistent  # noqa: B018
    assert group.workers[0].helper() == 42  # still callable on the worker itself


def test_registered_methods_still_work_on_a_bare_worker():
    worker = ToyWorker()
    assert (worker.rank, worker.world_size) == (0, 1)
    assert worker.whoami("x") == (0, 1, "x")
    with worker_placement(2, 4):
        assert ToyWorker().seen_at_init == (2, 4)


def test_plain_class_serves_as_a_single_worker_role():
    class Plain:  # not a Worker, nothing registered: the seed's ActorWorker style
        def __init__(self, k: int) -> None:
            self.k = k

        def times(self, x: int) -> int:
            return self.k * x

    group = LocalWorkerGroup(Plain, world_size=1, init_kwargs={"k": 3}, name="plain")
    assert group.call("times", 5) == 15  # the answer itself, not a list of one
    with pytest.raises(AttributeError, match="not registered"):
        LocalWorkerGroup(Plain, world_size=2, init_kwargs={"k": 3}).call("times", 5)
    with pytest.raises(AttributeError, match="no method 'nope'"):
        group.call("nope")


def test_group_rejects_bad_construction():
    with pytest.raises(TypeError, match="must be a class"):
        LocalWorkerGroup(object(), world_size=2)
    with pytest.raises(ValueError, match="world_size"):
        LocalWorkerGroup(ToyWorker, world_size=0)

    class Clashing(Worker):
        @register()
        def workers(self) -> None:
            pass

    with pytest.raises(ValueError, match="clashes"):
        LocalWorkerGroup(Clashing, world_size=1)


def test_register_validates_mode_and_usage():
    with pytest.raises(TypeError, match="parentheses"):

        @register
        def f(self):  # pragma: no cover
            pass

    with pytest.raises(ValueError, match="unknown dispatch mode"):
        register(dispatch_mode="nope")

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def g(self):  # pragma: no cover
        pass

    assert g.__verl_dispatch__ is Dispatch.ALL_TO_ALL


def test_worker_exception_names_role_rank_method_and_cause():
    class Failing(Worker):
        @register()
        def boom(self) -> None:
            if self.rank == 1:
                raise KeyError("missing field")

    with pytest.raises(WorkerError) as info:
        LocalWorkerGroup(Failing, world_size=2, name="reward").boom()
    error = info.value
    assert (error.role, error.rank, error.method, error.kind) == ("reward", 1, "boom", "exception")
    assert "role 'reward' rank 1" in str(error) and "KeyError" in str(error) and "missing field" in str(error)
    assert isinstance(error.__cause__, KeyError)


def test_restart_rebuilds_workers_and_restores_saved_state():
    class Counter(Worker):
        def __init__(self) -> None:
            self.count = 0

        @register()
        def bump(self) -> int:
            self.count += 1
            return self.count

        def get_state(self) -> int:
            return self.count

        def set_state(self, state: int) -> None:
            self.count = state

    group = LocalWorkerGroup(Counter, world_size=2)
    group.bump()
    group.bump()
    assert group.save_state() == 2
    group.bump()
    old = group.workers
    group.restart()
    assert all(new is not before for new, before in zip(group.workers, old, strict=True))
    assert group.bump() == [3, 3]  # restored to the saved 2, not the lost 3, nor a fresh 0


def test_restart_gives_each_rank_its_own_state_or_rank_0s():
    """Sharded workers each hold their own part (saved per rank); replicated ones answer None beyond rank 0."""

    class Shard(Worker):
        def __init__(self, replicated: bool) -> None:
            self.replicated = replicated
            self.part = f"part-{self.rank}"

        @register()
        def read(self) -> str:
            return self.part

        def get_state(self) -> str | None:
            return None if self.replicated and self.rank else self.part

        def set_state(self, state: str) -> None:
            self.part = state

    sharded = LocalWorkerGroup(Shard, world_size=2, init_kwargs={"replicated": False})
    assert sharded.save_state() == "part-0"
    sharded.restart()
    assert sharded.read() == ["part-0", "part-1"]
    replicated = LocalWorkerGroup(Shard, world_size=2, init_kwargs={"replicated": True})
    replicated.save_state()
    replicated.restart()
    assert replicated.read() == ["part-0", "part-0"]


# ---------------------------------------------------------------- the pure dispatch functions


def test_dispatch_one_to_all_shape():
    args, kwargs, pad = dispatch_one_to_all(2, 1, k="v")
    assert args == [(1,), (1,)] and kwargs == [{"k": "v"}, {"k": "v"}] and pad == 0


def test_dispatch_all_to_all_shape():
    args, kwargs, pad = dispatch_all_to_all(2, [1, 2], (3, 4), k=["x", "y"])
    assert args == [(1, 3), (2, 4)] and kwargs == [{"k": "x"}, {"k": "y"}] and pad == 0


def test_dispatch_dp_compute_proto_chunks():
    args, kwargs, pad = dispatch_dp_compute_proto(3, batch7(), 5, flag=True)
    assert pad == 2
    assert [a[0].non_tensor_batch["uid"].tolist() for a in args] == [
        ["a", "b", "c"],
        ["d", "e", "f"],
        ["g", "a", "b"],  # padding wraps around to the first rows
    ]
    assert [a[1] for a in args] == [5, 5, 5]
    assert kwargs == [{"flag": True}] * 3


def test_dispatch_dp_compute_proto_rejects_mismatched_lengths():
    short = DataProto.from_dict(tensors={"x": torch.zeros(2, 1)})
    with pytest.raises(DispatchError, match="same length.*7 rows.*2 rows"):
        dispatch_dp_compute_proto(3, batch7(), other=short)


def test_collect_dp_compute_proto_rejects_non_dataproto():
    good = DataProto.from_dict(tensors={"x": torch.zeros(1, 1)})
    with pytest.raises(DispatchError, match="rank 1 returned int"):
        collect_dp_compute_proto(2, [good, 3], 0)
    with pytest.raises(DispatchError, match="expected 2 outputs"):
        collect_dp_compute_proto(2, [good], 0)


def test_custom_dispatch_mode_can_be_registered():
    def dispatch_rank0_only(world_size, *args, **kwargs):
        return dispatch_one_to_all(world_size, *args, **kwargs)

    def collect_rank0(world_size, outputs, pad_size):
        return outputs[0]

    register_dispatch_mode("RANK0", dispatch_rank0_only, collect_rank0)
    try:
        with pytest.raises(ValueError, match="already registered"):
            register_dispatch_mode("RANK0", dispatch_rank0_only, collect_rank0)

        class W(Worker):
            @register(dispatch_mode="RANK0")
            def where(self) -> list[int]:
                return [self.rank, self.world_size]

        assert LocalWorkerGroup(W, world_size=3).where() == [0, 3]
    finally:
        del DISPATCH_MODES["RANK0"]


def test_dp_compute_proto_handles_object_columns_in_order():
    group = LocalWorkerGroup(ToyWorker, world_size=2)
    data = DataProto.from_dict(
        tensors={"x": torch.arange(5, dtype=torch.float32).unsqueeze(1)},
        non_tensors={"uid": ["v", "w", "x", "y", "z"]},
    )
    out = group.double(data)
    assert out.batch["x"].squeeze(1).tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert out.non_tensor_batch["rank"].tolist() == [0, 0, 0, 1, 1]
    assert isinstance(out.non_tensor_batch["uid"], np.ndarray)
