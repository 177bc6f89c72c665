"""Weight transports without an engine: bucketing, packing, checksums, completeness, atomic pushes."""

from __future__ import annotations

import pytest
import torch

from hetrl.transport.weights import (
    StagedWeights,
    TensorMeta,
    WeightStreamBroken,
    WeightSyncError,
    bucketize,
    build_weight_receiver,
    build_weight_sender,
    receive_device,
    resolve_transport,
    weight_sync_backend,
)
from hetrl.transport.weights.base import pack_bucket, unpack_bucket
from tests.rollout.helpers import push_over_gloo


def _state(seed: int = 0, num: int = 6) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tensors = {f"layer.{i}.weight": torch.randn(8, 4 + i, generator=generator) for i in range(num)}
    tensors["scale"] = torch.randn(3, generator=generator).to(torch.bfloat16)
    return tensors


def test_bucketize_respects_the_bound_and_keeps_order():
    state = _state()
    buckets = list(bucketize(state.items(), bucket_bytes=300))
    assert [name for bucket in buckets for name, _ in bucket] == list(state)
    for bucket in buckets:
        assert len(bucket) == 1 or sum(t.numel() * t.element_size() for _, t in bucket) <= 300
    with pytest.raises(ValueError):
        next(bucketize(state.items(), 0))


def test_pack_unpack_roundtrip_mixed_dtypes():
    state = _state()
    metas, buffer = pack_bucket(list(state.items()), with_checksum=True)
    assert buffer.dtype == torch.uint8 and buffer.numel() == sum(t.numel() * t.element_size() for t in state.values())
    for name, tensor in unpack_bucket(metas, buffer.clone()):
        assert tensor.dtype == state[name].dtype and torch.equal(tensor, state[name])
    with pytest.raises(WeightSyncError, match="bytes"):
        unpack_bucket(metas, buffer[:-1])


def test_checksums_catch_a_changed_tensor_and_completeness_is_checked():
    state = _state()
    staged = StagedWeights(version=3, tensors={})
    metas, buffer = pack_bucket(list(state.items()), with_checksum=True)
    staged.add(unpack_bucket(metas, buffer), metas)
    staged.verify_checksums()
    expected = {name: (tuple(t.shape), "F32") for name, t in state.items()}
    staged.check_complete(expected)
    staged.tensors["layer.0.weight"][0, 0] += 1.0
    with pytest.raises(WeightSyncError, match="checksum mismatch in 1"):
        staged.verify_checksums()
    with pytest.raises(WeightSyncError, match="missing"):
        staged.check_complete({**expected, "extra.weight": ((2,), "F32")})
    with pytest.raises(WeightSyncError, match="wrong shapes"):
        staged.check_complete({**expected, "scale": ((4,), "BF16")})
    with pytest.raises(WeightSyncError, match="sent twice"):
        staged.add([("scale", state["scale"])], metas[-1:])


def test_filesystem_push_is_atomic_and_versioned(tmp_path):
    sender = build_weight_sender("filesystem", root=tmp_path, verify=True)
    receiver = build_weight_receiver("filesystem", root=tmp_path, verify=True)
    with pytest.raises(WeightSyncError, match="LATEST"):
        receiver.receive()
    first = _state(1)
    sender.send(bucketize(first.items(), 200), version=1)

    def failing():
        yield list(_state(2).items())[:2]
        raise OSError("exporter died")

    with pytest.raises(OSError):
        sender.send(failing(), version=2)
    assert receiver.latest_version() == 1 and not list(tmp_path.glob(".v*"))
    staged = receiver.receive()
    assert staged.version == 1 and all(torch.equal(staged.tensors[n], t) for n, t in first.items())
    for version in (2, 3, 4):
        sender.send(bucketize(_state(version).items(), 200), version=version)
    assert sorted(p.name for p in tmp_path.glob("v*")) == ["v00000003", "v00000004"]
    assert receiver.receive().version == 4


def test_filesystem_receiver_waits_for_its_send_and_a_resend_replaces_it(tmp_path):
    """The engine hears of a push before the trainer has written it, and of a resend while the copy it
    refused is still on disk: it waits for the send it was told of, and a resend replaces the old copy."""
    import threading

    def send_later(state, **send_args):
        writer = threading.Timer(0.3, lambda: sender.send(bucketize(state.items(), 200), **send_args))
        writer.start()
        return writer

    first, resent = _state(3), _state(4)  # the resend's bytes differ only so that the test can tell the copies apart
    sender = build_weight_sender("filesystem", root=tmp_path)
    receiver = build_weight_receiver("filesystem", root=tmp_path, wait_s=30)
    writer = send_later(first, version=1)
    staged = receiver.receive(1)
    writer.join()
    assert staged.version == 1 and all(torch.equal(staged.tensors[n], t) for n, t in first.items())
    writer = send_later(resent, version=1, attempt=1)
    staged = receiver.receive(1, attempt=1)
    writer.join()
    assert all(torch.equal(staged.tensors[n], t) for n, t in resent.items()) and not list(tmp_path.glob(".v*"))
    impatient = build_weight_receiver("filesystem", root=tmp_path, wait_s=0.2)
    with pytest.raises(WeightStreamBroken, match="send 3 of weight push v1 did not appear"):
        impatient.receive(1, attempt=2)
    with pytest.raises(WeightStreamBroken, match="v2 did not appear"):
        impatient.receive(2)


def test_a_new_filesystem_sender_clears_what_the_last_one_left(tmp_path):
    """After a restart from a checkpoint, version numbers name new weights: a stale v1 must not pass for the new one."""
    build_weight_sender("filesystem", root=tmp_path).send(bucketize(_state(1).items(), 200), version=1)
    (tmp_path / "notes.txt").write_text("not ours")
    build_weight_sender("filesystem", root=tmp_path)
    receiver = build_weight_receiver("filesystem", root=tmp_path, wait_s=0.2)
    assert receiver.latest_version() is None and [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    with pytest.raises(WeightStreamBroken, match="v1 did not appear"):
        receiver.receive(1)


def test_gloo_push_roundtrip_with_verify():
    import torch.distributed as dist

    state = _state(5)
    staged, errors = push_over_gloo(bucketize(state.items(), 256), version=7, verify=True)
    assert not errors and staged.version == 7
    assert all(torch.equal(staged.tensors[n], t) and staged.tensors[n].dtype == t.dtype for n, t in state.items())
    assert all(meta.checksum is not None for meta in staged.sent.values())
    assert not dist.is_initialized()  # the default group is the trainer's; we never touch it


def _source_that_raises():
    yield list(_state(6).items())[:3]
    raise ValueError("exporter failed")


def _bucket_that_cannot_be_packed():
    yield list(_state(6).items())[:3]  # sent whole before the next bucket fails to pack
    yield [("not.a.tensor", [1.0, 2.0])]


@pytest.mark.parametrize("buckets", [_source_that_raises, _bucket_that_cannot_be_packed])
def test_gloo_push_voided_midway_raises_on_the_engine(buckets):
    outcome, errors = push_over_gloo(buckets(), version=2)
    assert isinstance(outcome, WeightSyncError) and "voided push v2" in str(outcome)
    assert len(errors) == 1 and isinstance(errors[0], (ValueError, AttributeError))


def test_resolve_transport():
    assert resolve_transport("auto", on_gpu=True, engines_on_sender_gpu=True) == "ipc"
    assert resolve_transport("auto", on_gpu=False, engines_on_sender_gpu=False) == "collective"
    assert resolve_transport("auto", on_gpu=True, engines_on_sender_gpu=False) == "collective"
    with pytest.raises(ValueError, match="trainer rank 0's GPU"):
        resolve_transport("ipc", on_gpu=True, engines_on_sender_gpu=False)
    # NCCL refuses two ranks of a communicator on one GPU: a one-GPU engine on rank 0's GPU gets gloo,
    # an engine of several GPUs receives on its second one.
    assert weight_sync_backend("collective", on_gpu=True, engine_on_sender_gpu=False) == "nccl"
    assert weight_sync_backend("collective", on_gpu=True, engine_on_sender_gpu=True) == "gloo"
    assert weight_sync_backend("collective", on_gpu=True, engine_on_sender_gpu=True, engine_tensor_parallel=4) == "nccl"
    assert weight_sync_backend("ipc", on_gpu=True, engine_on_sender_gpu=True) == "nccl"
    assert weight_sync_backend("collective", on_gpu=False, engine_on_sender_gpu=False) == "gloo"
    assert receive_device("collective", "nccl", on_sender_gpu=True) == torch.device("cuda", 1)
    assert receive_device("collective", "nccl", on_sender_gpu=False) is None
    assert receive_device("ipc", "nccl", on_sender_gpu=True) is None
    with pytest.raises(ValueError, match="root="):
        build_weight_sender("filesystem")
    with pytest.raises(ValueError, match="valid"):
        build_weight_sender("carrier-pigeon", root="/tmp")


def test_a_sender_that_vanishes_midway_times_out_into_a_sync_error():
    import threading
    from dataclasses import asdict

    from hetrl.transport.weights import init_weight_sync_group
    from hetrl.transport.weights.base import pack_bucket
    from hetrl.transport.weights.collective import BUCKET, send_message
    from tests.rollout.helpers import free_port

    port = free_port()

    def one_bucket_then_gone():
        group = init_weight_sync_group("127.0.0.1", port, rank=0, world_size=2, timeout_s=2)
        metas, payload = pack_bucket(list(_state(8).items()), with_checksum=False)
        send_message(group, BUCKET, {"version": 5, "tensors": [asdict(m) for m in metas]}, payload)

    thread = threading.Thread(target=one_bucket_then_gone)
    thread.start()
    group = init_weight_sync_group("127.0.0.1", port, rank=1, world_size=2, timeout_s=2)
    with pytest.raises(WeightStreamBroken, match="broke off after 7 tensors"):
        build_weight_receiver("collective", group=group).receive()
    thread.join()


def test_a_push_refused_for_its_content_is_read_to_its_end_and_the_next_one_arrives():
    """A bad push must not leave the group out of step: the engine refuses it and takes the next."""
    import threading

    from hetrl.transport.weights import init_weight_sync_group
    from tests.rollout.helpers import free_port

    port, state, errors = free_port(), _state(9), []
    twice = [list(state.items())[:2], list(state.items())[1:3], list(state.items())[3:]]  # a tensor in two buckets

    def two_pushes():
        try:
            group = init_weight_sync_group("127.0.0.1", port, rank=0, world_size=2, timeout_s=30)
            sender = build_weight_sender("collective", group=group)
            sender.send(twice, version=1)
            sender.send(bucketize(state.items(), 256), version=2)
        except BaseException as error:  # noqa: BLE001 - reported to the test thread
            errors.append(error)

    thread = threading.Thread(target=two_pushes)
    thread.start()
    receiver = build_weight_receiver(
        "collective", group=init_weight_sync_group("127.0.0.1", port, rank=1, world_size=2, timeout_s=30)
    )
    with pytest.raises(WeightSyncError, match="sent twice") as refused:
        receiver.receive()
    assert not isinstance(refused.value, WeightStreamBroken)
    staged = receiver.receive()
    thread.join()
    assert not errors and staged.version == 2
    assert all(torch.equal(staged.tensors[n], t) for n, t in state.items())


def test_shared_memory_pushes_are_named_by_owner_and_swept_when_it_is_gone(tmp_path, monkeypatch):
    """TP engines hand pushes to their workers in /dev/shm; a SIGKILLed engine's push must not hold RAM for ever."""
    import os
    import subprocess
    import sys

    from hetrl.transport.weights import shared_memory

    monkeypatch.setattr(shared_memory, "shared_memory_dir", lambda: tmp_path)
    state = _state(4)
    mine = shared_memory.write_push(state, version=3)
    assert mine.name.startswith(f"hetrl-push-{os.getpid()}-v3-")
    assert all(torch.equal(t, state[n]) and t.dtype == state[n].dtype for n, t in shared_memory.read_push(mine))
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    orphan = tmp_path / f"hetrl-push-{dead.stdout.strip()}-v2-x"
    orphan.mkdir()
    (orphan / "bucket_00000.bin").write_bytes(b"left by a killed engine")
    assert shared_memory.sweep_stale_pushes() == 1
    assert mine.exists() and not orphan.exists()


def test_a_push_staged_in_shared_memory_is_mapped_not_copied_and_no_room_refuses_it(tmp_path, monkeypatch):
    """The receiver of a TP engine stages each bucket in a /dev/shm file; a full /dev/shm refuses the push, cleanly."""
    import errno

    from hetrl.transport.weights import shared_memory

    monkeypatch.setattr(shared_memory, "shared_memory_dir", lambda: tmp_path)
    state = _state(5)
    staged, errors = push_over_gloo(bucketize(state.items(), 256), version=7, verify=True, shared_memory=True)
    assert not errors and staged.version == 7 and staged.shared_dir.parent == tmp_path
    assert all(torch.equal(staged.tensors[n], t) for n, t in state.items())
    assert sorted(name for name, _ in shared_memory.read_push(staged.shared_dir)) == sorted(state)
    shared_memory.remove_push(staged.shared_dir)
    assert all(torch.equal(staged.tensors[n], t) for n, t in state.items())  # still mapped once the files are gone

    def no_room(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shared_memory.os, "posix_fallocate", no_room)
    refused, errors = push_over_gloo(bucketize(state.items(), 256), version=8, shared_memory=True)
    assert not errors and isinstance(refused, WeightSyncError) and "no room" in str(refused)
    assert not isinstance(refused, WeightStreamBroken)  # read to its end: the next push can come
    assert not list(tmp_path.iterdir())


def test_a_kept_push_moves_to_host_and_stays_verifiable():
    state = _state()
    staged = StagedWeights(version=5, tensors=dict(state))
    staged.add([("extra", torch.ones(2))], [TensorMeta.of("extra", torch.ones(2), with_checksum=True)])
    kept = staged.on_host()
    assert kept.version == 5 and all(t.device.type == "cpu" for t in kept.tensors.values())
    assert kept.tensors["layer.0.weight"] is state["layer.0.weight"]  # already on the host: no copy
    kept.verify_checksums()
