"""The supported TensorFlow/Keras matrix and the gate's messages, on version strings.

``versions.py`` imports TensorFlow only in ``installed_versions``; it is loaded
from its file so these tests import neither Keras nor TensorFlow.
"""

import importlib.util
import pathlib

import pytest

VERSIONS = pathlib.Path(__file__).resolve().parents[2] / "hybridpar" / "compat" / "versions.py"


@pytest.fixture(scope="module")
def versions():
    spec = importlib.util.spec_from_file_location("versions_under_test", VERSIONS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("version", "line"), [
    ("2.21.0", "2.21"), ("3.15.1", "3.15"), ("2.20.0rc1", "2.20"), ("3.14.0.dev2026", "3.14"),
    ("2.19.1+local", "2.19"),
])
def test_release_line_drops_patch_and_tags(versions, version, line):
    assert versions.release_line(version) == line


@pytest.mark.parametrize(("tf_version", "keras_version"), [
    ("2.19.1", "3.15.1"), ("2.20.0", "3.15.0"), ("2.21.0", "3.13.2"), ("2.21.0", "3.14.1"),
    ("2.21.0", "3.15.1"),
])
def test_the_verified_pairs_are_supported(versions, tf_version, keras_version):
    assert versions.is_supported(tf_version, keras_version)


@pytest.mark.parametrize(("tf_version", "keras_version"), [
    ("2.19.1", "3.13.2"),  # Keras 3.13/3.14 only verified on TensorFlow 2.21
    ("2.20.0", "3.11.3"),  # Keras 3.11 lacks Sequential._autoconvert_optionals
    ("2.18.0", "3.15.1"), ("2.22.0", "3.15.1"), ("2.21.0", "3.16.0"), ("2.21.0", "2.15.0"),
])
def test_other_pairs_are_not(versions, tf_version, keras_version):
    assert not versions.is_supported(tf_version, keras_version)


def test_the_refusal_names_the_installed_versions_and_the_whole_matrix(versions):
    message = versions.unsupported_message("2.18.0", "3.15.1")
    assert "installed: TensorFlow 2.18.0, Keras 3.15.1" in message
    assert ("TensorFlow 2.19 with Keras 3.15; TensorFlow 2.20 with Keras 3.15; "
            "TensorFlow 2.21 with Keras 3.13, 3.14, 3.15") in message


def pinned_lines(constraints: pathlib.Path) -> tuple[str, str]:
    """The TensorFlow and Keras release lines a constraints file pins."""
    pins = dict(line.split("==") for line in constraints.read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    return ".".join(pins["tensorflow"].split(".")[:2]), ".".join(pins["keras"].split(".")[:2])


def test_make_test_versions_covers_exactly_the_supported_matrix(versions):
    """requirements/constraints.txt (make test) plus requirements/versions/ (make test-versions)."""
    requirements = VERSIONS.parents[2] / "requirements"
    environments = sorted(requirements.glob("versions/*.txt"))
    tested = {pinned_lines(path) for path in environments}
    for path in environments:
        tf_line, keras_line = pinned_lines(path)
        assert path.stem == f"tf{tf_line}-keras{keras_line}"
    main = pinned_lines(requirements / "constraints.txt")
    assert main not in tested and len(tested) == len(environments)
    supported = {(tf_line, keras_line) for tf_line, keras_lines in versions.SUPPORTED.items()
                 for keras_line in keras_lines}
    assert tested | {main} == supported


def test_the_mode_subset_runs_on_the_oldest_tensorflow_and_the_oldest_keras(versions):
    """make test-versions runs the subset across the modes on the ends of the matrix."""
    root = VERSIONS.parents[2]
    line = next(line for line in (root / "Makefile").read_text().splitlines()
                if line.startswith("VERSION_MODE_PAIRS :="))
    named = set(line.split(":=")[1].split())
    environments = {path.stem: pinned_lines(path)
                    for path in (root / "requirements").glob("versions/*.txt")}
    assert named <= set(environments)
    lines = [environments[name] for name in named]
    release = lambda line: tuple(map(int, line.split(".")))  # noqa: E731
    oldest_tf = min((tf_line for tf_line, _ in environments.values()), key=release)
    oldest_keras = min((keras_line for _, keras_line in environments.values()), key=release)
    assert any(tf_line == oldest_tf for tf_line, _ in lines)
    assert any(keras_line == oldest_keras for _, keras_line in lines)
