"""sglang's row stays honest: the rules sglang 0.5.23's loader fails are in docs/upstream.md.

docs/upstream.md lists every rule the upstream loader fails under the suite (between the
`<!-- sglang-failures -->` markers), each with the line of sglang's source that shows the
behaviour and whether the rule is a gap SPEC names ([+]) or an upstream rule sglang breaks ([U]).
`docs/matrix/sglang-cpu.json` is the report `tox -e matrix-sglang` last wrote.

Two checks. In every run (cheap): the table is well formed, each row's origin is the catalogue's,
and the committed report fails exactly the table's rules. In the selftest tier, where sglang is
installed (`tox -e matrix-sglang` runs it after writing a fresh report): the suite as it is now
is run against sglang (or the fresh report named by `SGLANG_ROW_REPORT` is read) and must fail
exactly the table's rules, so a suite change that flips one of sglang's verdicts is seen.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reference.rules import BY_ID

pytestmark = pytest.mark.internal

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = ROOT / "docs" / "upstream.md"
COMMITTED = ROOT / "docs" / "matrix" / "sglang-cpu.json"
ADAPTER = "reference.kit.adapters.sglang:SglangLoader"
BEGIN, END = "<!-- sglang-failures -->", "<!-- /sglang-failures -->"
ROW = re.compile(
    r"^\| (?P<rule>[A-Z0-9]+-\d+[a-z]?) \| (?P<origin>\[\+\]|\[U\]) \| (?P<source>[^|]+) \|"
)
SOURCE = re.compile(r"`sglang/[\w/.]+\.py:\d+(?:-\d+)?`")
# The whole contract suite against sglang, in a fresh interpreter a deadline stops.
DEADLINE_S = 3600


def table() -> dict[str, tuple[str, str]]:
    """docs/upstream.md's table: rule -> (origin mark, source column)."""
    if not UPSTREAM.is_file():
        pytest.skip("no docs/upstream.md beside the tests (an installed copy of the suite)")
    text = UPSTREAM.read_text(encoding="utf-8")
    assert BEGIN in text, f"docs/upstream.md has no {BEGIN} ... {END} table"
    assert END in text, f"docs/upstream.md has no {BEGIN} ... {END} table"
    rows: dict[str, tuple[str, str]] = {}
    for line in text.split(BEGIN, 1)[1].split(END, 1)[0].splitlines():
        match = ROW.match(line)
        if match:
            assert match["rule"] not in rows, f"{match['rule']} is in the table twice"
            rows[match["rule"]] = (match["origin"], match["source"])
    assert rows, "the sglang table has no rows"
    return rows


def failed(report: dict[str, Any]) -> set[str]:
    return {rule for rule, entry in report["rules"].items() if entry["status"] == "failed"}


def test_the_table_names_catalogue_rules_their_origin_and_a_source_line() -> None:
    for rule, (origin, source) in table().items():
        assert rule in BY_ID, f"{rule} is not a rule of the catalogue"
        expected = "[+]" if BY_ID[rule].origin == "beyond" else "[U]"
        assert origin == expected, f"{rule} is {expected} in the catalogue, {origin} in the table"
        assert SOURCE.search(source), f"{rule}: no sglang file:line in {source.strip()!r}"


def test_the_committed_report_fails_exactly_the_tables_rules() -> None:
    if not COMMITTED.is_file():
        pytest.skip(f"no committed sglang report at {COMMITTED}: tox -e matrix-sglang writes it")
    report = json.loads(COMMITTED.read_text(encoding="utf-8"))
    assert report["loader"]["name"] == "sglang"
    assert sorted(failed(report)) == sorted(table())


def fresh_report(tmp_path: Path) -> dict[str, Any]:
    """The report of the suite as it is now against sglang: the one `SGLANG_ROW_REPORT` names,
    or a run made here."""
    named = os.environ.get("SGLANG_ROW_REPORT")
    if named and Path(named).is_file():
        return json.loads(Path(named).read_text(encoding="utf-8"))
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang 0.5.23 is not installed here: tox -e matrix-sglang builds its env")
    out = tmp_path / "sglang.json"
    command = [
        sys.executable,
        "-m",
        "pytest",
        str(ROOT / "tests" / "unit"),
        "-q",
        "-m",
        "not internal",
        "--runtime-device=cpu",
        f"--loader={ADAPTER}",
        f"--conformance-report={out}",
        f"--basetemp={tmp_path / 'run'}",
        "-p",
        "no:cacheprovider",
    ]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}
    subprocess.run(command, cwd=ROOT, env=env, timeout=DEADLINE_S, capture_output=True, check=False)
    assert out.is_file(), "the run against sglang wrote no report"
    return json.loads(out.read_text(encoding="utf-8"))


@pytest.mark.selftest
def test_sglang_still_fails_exactly_the_tables_rules(tmp_path: Path) -> None:
    report = fresh_report(tmp_path)
    got, listed = failed(report), set(table())
    assert not got - listed, (
        f"sglang fails rules the table in docs/upstream.md does not list: {sorted(got - listed)}"
    )
    assert not listed - got, (
        f"rules the table lists that sglang no longer fails: {sorted(listed - got)}"
    )


@pytest.mark.selftest
def test_the_adapter_hands_sglang_the_precisions_in_its_own_spelling() -> None:
    """PREC through the sglang adapter: the suite's `Precisions` become upstream's
    `dit_precision`, `vae_precision` and `component_precisions` fields, spelled as its flags
    take them. Runs where sglang is installed (`tox -e matrix-sglang`)."""
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang 0.5.23 is not installed here: tox -e matrix-sglang builds its env")
    import torch

    from reference.kit.adapters.sglang import _precision_fields
    from reference.kit.seam import Precisions

    fields = _precision_fields(
        Precisions(
            dit=torch.bfloat16, vae=torch.float32, components={"transformer_2": torch.float16}
        )
    )
    assert fields == {
        "dit_precision": "bf16",
        "vae_precision": "fp32",
        "component_precisions": {"transformer_2": "fp16"},
    }
    assert _precision_fields(None) == {}, "no precisions must leave sglang's defaults"


@pytest.mark.selftest
def test_the_precisions_reach_sglangs_server_args_and_pipeline_config() -> None:
    """`--dit-precision` and `--vae-precision` are fields of sglang's PipelineConfig, and
    `--component-precisions.<c>` one of its ServerArgs: both the seam's `make_server_args` and
    the command line put each where sglang's loaders read it (`resolve_precision`)."""
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang 0.5.23 is not installed here: tox -e matrix-sglang builds its env")
    import torch

    from reference.kit.adapters.sglang import SglangLoader
    from reference.kit.seam import Precisions, ServingOptions

    loader = SglangLoader()
    precisions = Precisions(
        dit=torch.float16, vae=torch.bfloat16, components={"transformer_2": torch.float32}
    )
    made: Any = loader.make_server_args(
        ServingOptions(runtime_device=torch.device("cpu"), precisions=precisions)
    )
    parsed: Any
    parsed, rest = loader.parse_server_args(
        [
            "--zz-unrelated-option",
            "--dit-precision",
            "fp16",
            "--vae-precision=bf16",
            "--component_precisions.transformer_2",
            "fp32",
        ]
    )
    assert rest == ["--zz-unrelated-option"]
    for args in (made, parsed):
        assert args.pipeline_config.dit_precision == "fp16"
        assert args.pipeline_config.vae_precision == "bf16"
        assert args.component_precisions == {"transformer_2": "fp32"}
    defaults: Any = loader.parse_server_args([])[0]
    assert (defaults.pipeline_config.dit_precision, defaults.pipeline_config.vae_precision) == (
        "bf16",
        "fp32",
    )
