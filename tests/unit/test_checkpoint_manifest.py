"""The format's pure rules (hybridpar.checkpoint.manifest): names, slices, file checks."""

from hybridpar.checkpoint import manifest


def test_names_of_keys_and_bundle_files():
    assert manifest.key("optimizer", 7) == "optimizer/00007"
    assert manifest.data_file(1, 3) == "state.data-00001-of-00003"
    assert manifest.checkpoint_name(12) == "ckpt-00000012"
    assert manifest.step_of_name("ckpt-00000012") == 12
    assert manifest.step_of_name(".partial-ckpt-00000012-4") is None


def test_row_slices_in_tensorflows_shape_and_slice_syntax():
    assert manifest.slice_spec((4000, 16), None, None) == ""
    assert manifest.slice_spec((4000, 16), 2000, 2000) == "4000 16 2000,2000:-"
    assert manifest.slice_spec((10,), 3, 4) == "10 3,4"
    assert manifest.slice_spec((6, 2, 5), 0, 3) == "6 2 5 0,3:-:-"


def test_a_file_is_checked_for_presence_size_then_hash():
    expected = {"bytes": 10, "sha256": "ab" * 32}
    assert manifest.file_problem("f", None, expected) == "f is missing"
    assert manifest.file_problem("f", 4, expected) == (
        "f has 4 bytes, the manifest says 10 (truncated?)")
    assert manifest.file_problem("f", 10, expected) is None
    assert manifest.hash_problem("f", "ab" * 32, expected) is None
    assert manifest.hash_problem("f", "cd" * 32, expected).startswith(
        "f has SHA-256 cdcdcdcdcdcd..., the manifest says abababababab...")


def test_parameter_server_topology_names_its_servers():
    assert manifest.describe_topology(
        {"mode": "parameter_server", "num_workers": 2, "num_ps": 3}
    ) == ("parameter_server, 2 training task(s) (chief and workers), variables on 3 parameter "
          "server(s)")
