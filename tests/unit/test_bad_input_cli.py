"""The reference's command line on bad weights: one line on stderr, exit 2, nothing loaded.

`python -m reference load DIR` runs as a user would run it, CUDA hidden, in this interpreter
(command.py), on a corpus pipeline (fakes/corpus_models.py) whose transformer or VAE
weights are a bad checkpoint. A few representative cases only: every case on every in-process path
is in test_bad_input.py and test_pickle.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fakes.corpus_models import corpus_pipeline
from fakes.corrupt import write_bad_checkpoint
from fakes.pickles import write_pickle_case
from reference.kit.judging.guards import Seal

from .command import Result, run_reference

pytestmark = pytest.mark.internal


def load_command(pipeline: Path) -> Result:
    argv = [
        "load",
        str(pipeline),
        "--models",
        "fakes.corpus_models",
        "--dit-cpu-offload",
    ]
    return run_reference(*argv, hide_cuda=True)


def assert_refused_in_one_line(result: Result, where: str, words: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stdout == "", "a table was printed: something looked loaded"
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: {where}: "), result.stderr
    assert words in result.stderr


@pytest.mark.reference_only("runs the reference's own command line")
@pytest.mark.parametrize(
    ("component", "case"),
    [("transformer", "truncated-in-data"), ("vae", "index-names-missing-shard")],
)
def test_corrupt_weights_end_the_command_with_one_line(
    tmp_path: Path, component: str, case: str
) -> None:
    folder = corpus_pipeline(tmp_path, emptied=component)
    bad = write_bad_checkpoint(case, folder)
    seal = Seal()
    seal.add(tmp_path)
    result = load_command(tmp_path)
    assert_refused_in_one_line(result, f"{folder / bad.file} [{bad.entry}]", bad.words)
    assert seal.broken() == []


@pytest.mark.reference_only("runs the reference's own command line")
def test_pickle_weights_are_refused_and_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled.txt"
    folder = corpus_pipeline(tmp_path / "pipeline", emptied="transformer")
    case = write_pickle_case("pickle-file", folder, marker=marker)
    seal = Seal()
    seal.add(tmp_path)
    result = load_command(tmp_path / "pipeline")
    assert_refused_in_one_line(result, str(case.path), case.words)
    assert not marker.exists(), "the pickle was unpickled: code from the checkpoint ran"
    assert seal.broken() == []
