"""The request and answer through the checkpoint directory by which a ps hashes its own files."""

import hashlib
import logging
import threading

from hybridpar.checkpoint import remote_hashing


def partial_with_shard(tmp_path, data=b"rows of ps:0"):
    partial = tmp_path / ".partial-ckpt-00000007-123"
    partial.mkdir()
    (partial / "state.data-00001-of-00002").write_bytes(data)
    return partial


def test_the_ps_answers_the_chiefs_request_and_leaves_no_file(tmp_path):
    partial = partial_with_shard(tmp_path)
    (tmp_path / ".hybridpar-hasher-ps-0").write_text("1")  # as serve_in_background announces

    def ps_task():  # polls until it answered once
        while not remote_hashing.answer_pending(tmp_path, "ps:0"):
            pass

    thread = threading.Thread(target=ps_task)
    thread.start()
    entries = remote_hashing.Requester(tmp_path)(partial, "ps:0", ["state.data-00001-of-00002"])
    thread.join(timeout=10)
    assert entries == {"state.data-00001-of-00002": {
        "bytes": 12, "sha256": hashlib.sha256(b"rows of ps:0").hexdigest()}}
    assert sorted(p.name for p in partial.iterdir()) == ["state.data-00001-of-00002"]


def test_a_ps_that_never_announced_itself_is_hashed_by_the_chief_with_a_warning(tmp_path,
                                                                                caplog):
    partial = partial_with_shard(tmp_path)
    requester = remote_hashing.Requester(tmp_path, timeout_seconds=0.1)
    with caplog.at_level(logging.WARNING, logger="hybridpar"):
        entries = requester(partial, "ps:1", ["state.data-00001-of-00002"])
        requester(partial, "ps:1", ["state.data-00001-of-00002"])
    assert entries["state.data-00001-of-00002"]["bytes"] == 12
    assert caplog.text.count("ps:1 did not hash the checkpoint files it wrote (its script's "
                             "hybridpar.scope() config has no checkpoint.dir)") == 1


def test_a_silent_ps_times_out_into_the_chiefs_hash(tmp_path, caplog):
    partial = partial_with_shard(tmp_path)
    (tmp_path / ".hybridpar-hasher-ps-0").write_text("1")
    with caplog.at_level(logging.WARNING, logger="hybridpar"):
        entries = remote_hashing.Requester(tmp_path, timeout_seconds=0.05)(
            partial, "ps:0", ["state.data-00001-of-00002"])
    assert entries["state.data-00001-of-00002"]["bytes"] == 12
    assert "it did not answer within 0.05 s" in caplog.text
    assert not list(partial.glob(".hash*"))
