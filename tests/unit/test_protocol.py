import pickle

import numpy as np
import pytest
import torch

from verl.protocol import DataProto, DataProtoItem, pad_dataproto_to_divisor, unpad_dataproto


def make(n: int = 4) -> DataProto:
    """Rows are easy to recognise: obs[i] = [i, 10 + i], uid[i] = f"u{i}", info[i] = {"i": i}."""
    return DataProto.from_dict(
        tensors={
            "obs": torch.stack([torch.arange(n), 10 + torch.arange(n)], dim=1),
            "act": torch.arange(n) * 1.0,
        },
        non_tensors={"uid": [f"u{i}" for i in range(n)], "info": [{"i": i} for i in range(n)]},
        meta_info={"temperature": 1.0},
    )


def uids(data: DataProto) -> list[str]:
    return data.non_tensor_batch["uid"].tolist()


def assert_same(a: DataProto, b: DataProto) -> None:
    assert a.batch.keys() == b.batch.keys() and a.non_tensor_batch.keys() == b.non_tensor_batch.keys()
    for k in a.batch:
        assert torch.equal(a.batch[k], b.batch[k]), k
    for k in a.non_tensor_batch:
        assert a.non_tensor_batch[k].tolist() == b.non_tensor_batch[k].tolist(), k
    assert a.meta_info == b.meta_info


# ---------------------------------------------------------------- construction and validation


def test_from_dict_builds_1d_object_arrays_even_for_equal_length_lists():
    data = DataProto.from_dict(
        tensors={"x": torch.zeros(2, 3)}, non_tensors={"pair": [[1, 2], [3, 4]], "d": [{"a": 1}, {"a": 2}]}
    )
    assert data.non_tensor_batch["pair"].shape == (2,)
    assert data.non_tensor_batch["pair"].dtype == object
    assert data.non_tensor_batch["pair"][1] == [3, 4]
    assert data.non_tensor_batch["d"][0] == {"a": 1}
    assert len(data) == 2 and data.meta_info == {}


def test_from_dict_keeps_numpy_arrays_and_rejects_strings():
    ints = np.array([1, 2, 3])
    assert DataProto.from_dict(non_tensors={"n": ints}).non_tensor_batch["n"] is ints
    with pytest.raises(TypeError, match="'s'"):
        DataProto.from_dict(non_tensors={"s": "abc"})


def test_from_single_dict_splits_tensors_from_the_rest():
    data = DataProto.from_single_dict({"x": torch.ones(2), "name": ["a", "b"]}, meta_info={"k": 1})
    assert list(data.batch) == ["x"] and list(data.non_tensor_batch) == ["name"]
    assert data.non_tensor_batch["name"].tolist() == ["a", "b"] and data.meta_info == {"k": 1}


def test_mismatched_dim0_names_key_and_both_sizes():
    with pytest.raises(ValueError, match=r"batch\['b'\] has size 3 .* batch\['a'\] has size 2"):
        DataProto.from_dict({"a": torch.zeros(2), "b": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"non_tensor_batch\['u'\] has size 1"):
        DataProto.from_dict({"a": torch.zeros(2)}, {"u": ["x"]})


def test_bad_types_and_scalars_rejected():
    with pytest.raises(TypeError, match="from_dict converts lists"):
        DataProto(non_tensor_batch={"u": ["a"]})
    with pytest.raises(TypeError, match="must be a Tensor"):
        DataProto(batch={"x": [1, 2]})
    with pytest.raises(ValueError, match="0-dimensional"):
        DataProto(batch={"x": torch.tensor(1.0)})


def test_check_consistency_catches_direct_dict_mutation():
    data = make()
    data.batch["bad"] = torch.zeros(5)
    with pytest.raises(ValueError, match="'bad'"):
        data.check_consistency()


def test_empty_and_non_tensor_only_lengths():
    empty = DataProto()
    assert len(empty) == 0 and DataProto(None, None, None).batch == {}
    assert len(DataProto.from_dict(non_tensors={"u": ["a", "b", "c"]})) == 3
    assert empty.split(2) == [] and [len(c) for c in empty.chunk(2)] == [0, 0]
    with pytest.raises(IndexError, match="out of range"):
        empty[0]
    zero_rows = make()[0:0]
    assert len(zero_rows) == 0 and zero_rows.batch["obs"].shape == (0, 2)


def test_repr_is_short_and_informative():
    text = repr(make())
    assert "batch_size=4" in text and "obs: (4, 2) int64" in text and "act: (4,) float32" in text
    assert "uid: (4,) object" in text and "meta_info_keys=['temperature']" in text


# ---------------------------------------------------------------- indexing


def test_int_index_returns_item_without_batch_dim():
    item = make()[-1]
    assert isinstance(item, DataProtoItem)
    assert item.batch["obs"].tolist() == [3, 13] and item.non_tensor_batch["info"] == {"i": 3}
    assert make()[np.int64(1)].non_tensor_batch["uid"] == "u1"
    assert make()[torch.tensor(2)].non_tensor_batch["uid"] == "u2"
    with pytest.raises(IndexError):
        make()[4]
    assert [it.non_tensor_batch["uid"] for it in make(3)] == ["u0", "u1", "u2"]


def test_slice_list_array_tensor_and_mask_indexing():
    data = make(5)
    assert uids(data[1:4]) == ["u1", "u2", "u3"]
    assert data[::2].batch["obs"][:, 0].tolist() == [0, 2, 4]
    assert uids(data[[4, 0]]) == ["u4", "u0"]
    assert uids(data[np.array([3, -1])]) == ["u3", "u4"]
    assert uids(data[torch.tensor([2, 2])]) == ["u2", "u2"]
    mask = [True, False, True, False, False]
    assert uids(data[mask]) == ["u0", "u2"]
    assert uids(data[torch.tensor(mask)]) == ["u0", "u2"]
    assert data[[]].batch["obs"].shape == (0, 2)
    assert uids(data.select_idxs(np.array([1, 0]))) == ["u1", "u0"]


def test_bad_indices_raise_clearly():
    data = make(3)
    with pytest.raises(IndexError, match="length 2 but the batch size is 3"):
        data[[True, False]]
    with pytest.raises(IndexError, match="out of range"):
        data[[0, 3]]
    with pytest.raises(IndexError, match="1-D"):
        data[np.zeros((1, 1), dtype=int)]


def test_slices_share_storage_but_not_meta_info():
    data = make()
    part = data[:2]
    part.batch["act"][0] = 99.0
    part.meta_info["new"] = 1
    assert data.batch["act"][0] == 99.0 and "new" not in data.meta_info


# ---------------------------------------------------------------- keys: select, pop, rename, union


def test_select_keeps_requested_keys_and_optionally_deep_copies():
    data = make()
    sub = data.select(batch_keys=["obs"], non_tensor_batch_keys=[], meta_info_keys=["temperature"])
    assert list(sub.batch) == ["obs"] and sub.non_tensor_batch == {} and sub.meta_info == {"temperature": 1.0}
    assert sub.batch["obs"] is data.batch["obs"]
    deep = data.select(batch_keys="act", deepcopy=True)
    deep.batch["act"][0] = -1.0
    assert data.batch["act"][0] == 0.0 and list(deep.non_tensor_batch) == ["uid", "info"]
    with pytest.raises(KeyError, match="missing"):
        data.select(batch_keys=["missing"])


def test_pop_removes_from_self():
    data = make()
    popped = data.pop(batch_keys=["act"], non_tensor_batch_keys=["info"], meta_info_keys=["temperature"])
    assert list(popped.batch) == ["act"] and list(popped.non_tensor_batch) == ["info"]
    assert popped.meta_info == {"temperature": 1.0} and len(popped) == 4
    assert list(data.batch) == ["obs"] and list(data.non_tensor_batch) == ["uid"] and data.meta_info == {}
    with pytest.raises(KeyError):
        data.pop(batch_keys=["obs", "nope"])
    assert "obs" in data.batch  # a failed pop leaves self unchanged


def test_rename():
    data = make().rename(["obs", "uid"], ["observation", "id"])
    assert list(data.batch) == ["observation", "act"] and list(data.non_tensor_batch) == ["id", "info"]
    data.rename("act", "observation2")
    with pytest.raises(ValueError, match="already exist"):
        data.rename("id", "info")
    with pytest.raises(KeyError):
        data.rename("nope", "x")


def test_union_merges_and_accepts_equal_overlap():
    data = make()
    extra = DataProto.from_dict(
        {"reward": torch.ones(4), "obs": data.batch["obs"].clone()}, meta_info={"step": 3}
    )
    out = data.union(extra)
    assert out is data and set(data.batch) == {"obs", "act", "reward"}
    assert data.meta_info == {"temperature": 1.0, "step": 3}
    nan = DataProto.from_dict({"v": torch.tensor([float("nan")])})
    nan.union(DataProto.from_dict({"v": torch.tensor([float("nan")])}))  # NaN == NaN for conflicts


@pytest.mark.parametrize(
    "other, key",
    [
        (DataProto.from_dict({"act": torch.zeros(4)}), "batch['act']"),
        (DataProto.from_dict(non_tensors={"uid": ["x", "u1", "u2", "u3"]}), "non_tensor_batch['uid']"),
        (DataProto(meta_info={"temperature": 0.5}), "meta_info['temperature']"),
    ],
)
def test_union_conflict_raises_and_names_key(other, key):
    data = make()
    with pytest.raises(ValueError, match=key.replace("[", r"\[").replace("]", r"\]")):
        data.union(other)
    assert data.meta_info == {"temperature": 1.0}


def test_union_batch_size_mismatch():
    with pytest.raises(ValueError, match="4 vs 3"):
        make(4).union(DataProto.from_dict({"r": torch.ones(3)}))


# ---------------------------------------------------------------- chunk, split, concat, repeat, reorder


def test_chunk_and_split():
    data = make(6)
    assert [uids(c) for c in data.chunk(3)] == [["u0", "u1"], ["u2", "u3"], ["u4", "u5"]]
    assert [len(s) for s in data.split(4)] == [4, 2]
    with pytest.raises(ValueError, match="size 6 into 4 equal parts"):
        data.chunk(4)


def test_concat_of_splits_equals_original():
    data = make(5)
    assert_same(DataProto.concat(data.split(2)), data)
    assert_same(DataProto.concat(data.chunk(5)), data)


def test_concat_key_mismatch_names_keys():
    a, b = make(2), make(2)
    b.pop(batch_keys=["act"])
    b.batch["extra"] = torch.zeros(2)
    with pytest.raises(ValueError, match=r"missing \['act'\], extra \['extra'\]"):
        DataProto.concat([a, b])
    with pytest.raises(ValueError, match="at least one"):
        DataProto.concat([])


def test_concat_takes_meta_info_from_first():
    a, b = make(1), make(1)
    b.meta_info["temperature"] = 2.0
    assert DataProto.concat([a, b]).meta_info == {"temperature": 1.0}


def test_repeat_interleave_and_tile():
    data = DataProto.from_dict({"x": torch.tensor([1, 2, 3])}, {"s": ["a", "b", "c"]})
    inter = data.repeat(2, interleave=True)
    assert inter.batch["x"].tolist() == [1, 1, 2, 2, 3, 3]
    assert inter.non_tensor_batch["s"].tolist() == ["a", "a", "b", "b", "c", "c"]
    tiled = data.repeat(2, interleave=False)
    assert tiled.batch["x"].tolist() == [1, 2, 3, 1, 2, 3]
    assert tiled.non_tensor_batch["s"].tolist() == ["a", "b", "c", "a", "b", "c"]
    assert make().repeat(3).batch["obs"].shape == (12, 2)


def test_sample_level_repeat():
    data = DataProto.from_dict({"x": torch.tensor([1, 2, 3])}, {"s": ["a", "b", "c"]})
    out = data.sample_level_repeat([2, 0, 1])
    assert out.batch["x"].tolist() == [1, 1, 3] and out.non_tensor_batch["s"].tolist() == ["a", "a", "c"]
    assert data.sample_level_repeat(torch.tensor([1, 1, 1])).batch["x"].tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="one repeat count per sample"):
        data.sample_level_repeat([1, 2])


def test_reorder_in_place():
    data = make(4)
    assert data.reorder(torch.tensor([2, 0, 3, 1])) is None
    assert uids(data) == ["u2", "u0", "u3", "u1"]
    assert data.batch["obs"][:, 0].tolist() == [2, 0, 3, 1]
    with pytest.raises(ValueError, match="permutation"):
        data.reorder([0, 0, 1, 2])


# ---------------------------------------------------------------- padding


@pytest.mark.parametrize("n, divisor, pad", [(5, 4, 3), (4, 4, 0), (2, 7, 5)])
def test_pad_unpad_round_trip(n, divisor, pad):
    data = make(n)
    padded, pad_size = pad_dataproto_to_divisor(data, divisor)
    assert pad_size == pad and len(padded) % divisor == 0
    assert_same(unpad_dataproto(padded, pad_size), data)


def test_pad_repeats_rows_from_the_start():
    padded, pad_size = pad_dataproto_to_divisor(make(2), 7)
    assert pad_size == 5 and uids(padded) == ["u0", "u1", "u0", "u1", "u0", "u1", "u0"]
    with pytest.raises(ValueError):
        unpad_dataproto(make(2), 3)


# ---------------------------------------------------------------- device, iterator, persistence


def test_to_moves_tensors_and_returns_self():
    data = make()
    assert data.to("cpu") is data and data.batch["obs"].device.type == "cpu"
    assert isinstance(data.non_tensor_batch["uid"], np.ndarray)


def test_make_iterator_sizes_and_coverage():
    data = make(6)
    batches = list(data.make_iterator(mini_batch_size=2, epochs=2))
    assert [uids(b) for b in batches] == [["u0", "u1"], ["u2", "u3"], ["u4", "u5"]] * 2
    assert batches[0].meta_info == {"temperature": 1.0}

    shuffled = [uids(b) for b in data.make_iterator(2, epochs=3, seed=7, shuffle=True)]
    assert all(len(b) == 2 for b in shuffled) and len(shuffled) == 9
    for epoch in range(3):
        assert sorted(sum(shuffled[3 * epoch : 3 * epoch + 3], [])) == uids(data)
    again = [uids(b) for b in data.make_iterator(2, epochs=3, seed=7, dataloader_kwargs={"shuffle": True})]
    assert again == shuffled


def test_make_iterator_rejects_bad_arguments_eagerly():
    with pytest.raises(ValueError, match="divide batch size 6"):
        make(6).make_iterator(4, epochs=1)
    with pytest.raises(ValueError, match="drop_last"):
        make(6).make_iterator(2, epochs=1, dataloader_kwargs={"drop_last": True})


def test_pickle_round_trip():
    data = make()
    restored = pickle.loads(pickle.dumps(data))
    assert_same(restored, data)
    assert restored.non_tensor_batch["info"][2] == {"i": 2}


def test_save_and_load_from_disk(tmp_path):
    data = make()
    path = str(tmp_path / "batch.pt")
    data.save_to_disk(path)
    assert_same(DataProto.load_from_disk(path), data)
    torch.save({"not": "a DataProto"}, path)
    with pytest.raises(TypeError, match="not a DataProto"):
        DataProto.load_from_disk(path)
