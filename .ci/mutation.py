"""Mutation testing of the reference's core modules, one module at a time (`tox -e mutation`).

Contract: for each module named (default: all of `MODULES`), copy the working tree's files that
git tracks or does not ignore into a fresh work folder, point mutmut 3 at that one module and at
the module's own test files only, run it there, and read back its counts. The working tree is
never written to: mutmut's `mutants/` folder, its state and every pytest run live in the copy.
At the end a table (module, mutants, killed, survived, no tests, timeout, score) is printed and
written as Markdown to `--out`, with each surviving mutant's diff under `--out`'s folder.

Score = (killed + timeout) / mutants: a mutant that no test reaches ("no tests") counts as not
killed. Exit status 0 unless mutmut itself failed for a module (a low score does not fail).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Each core module and the test files that exercise it directly (in tests/unit). Most tests reach
# a module through the loader fixture, so the map follows which rules each file pins; mutmut's
# own stats pass then runs, per mutant, only the tests that call the mutated function.
# The step folder each core module sits in (reference/<step>/<module>.py).
STEP = {
    "plan": "request",
    "args": "request",
    "admission": "request",
    "preflight": "read",
    "header": "read",
    "checkpoint": "read",
    "postload": "place",
    "slots": "place",
    "stream": "place",
    "adopt": "place",
}
MODULES: dict[str, tuple[str, ...]] = {
    "plan": ("test_plan.py", "test_dev.py", "test_plan_direct_default.py", "test_plan_wording.py"),
    "args": ("test_args.py", "test_adm.py", "test_args_command_line.py", "test_args_wording.py"),
    "preflight": ("test_dg.py", "test_vae.py", "test_adm.py", "test_preflight_wording.py"),
    "header": ("test_ckpt.py", "test_bad_input.py", "test_header_limits.py"),
    "checkpoint": ("test_ckpt.py", "test_bad_input.py", "test_checkpoint_index.py"),
    "postload": (
        "test_fp8.py",
        "test_zc_loads.py",
        "test_postload_steps.py",
        "test_fp8_fsdp_resident.py",
    ),
    "admission": (
        "test_adm.py",
        "test_adm_defaults.py",
        "test_args.py",
        "test_admission_wording.py",
    ),
    "slots": ("test_vae.py", "test_slots_abi.py"),
    "stream": ("test_vae.py", "test_stream_steps.py"),
    "adopt": (
        "test_zc.py",
        "test_zc_loads.py",
        "test_dg.py",
        "test_tp.py",
        "test_adopt_internals.py",
    ),
}

# Copied into the work folder (filtered by git so no caches or build outputs travel along).
COPIED = ("reference", "fakes", "tests", "pyproject.toml")


@dataclass(frozen=True)
class Source:
    """What is copied: the working tree (rev None), or commit `rev` plus `overlay` files."""

    rev: str | None = None
    overlay: list[Path] = field(default_factory=list)
    deselect_failing: bool = False
    slack: float = 40.0


@dataclass(frozen=True)
class Score:
    """mutmut's counts for one module."""

    module: str
    total: int
    killed: int
    survived: int
    no_tests: int
    timeout: int
    other: int
    seconds: float
    error: str | None = None
    left_out: int = 0

    @property
    def score(self) -> float:
        """Percent of mutants killed (a timeout is a kill); 0 when there are none."""
        return 100.0 * (self.killed + self.timeout) / self.total if self.total else 0.0


def git(*args: str) -> bytes:
    """Output of one git command run in the repository."""
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True).stdout


def tracked_files() -> list[Path]:
    """The working tree's files that git tracks or does not ignore, under `COPIED`."""
    listing = git("ls-files", "-co", "--exclude-standard", "-z", "--", *COPIED).decode()
    return [
        Path(p)
        for p in listing.split("\0")
        if p and ((ROOT / p).is_file() or (ROOT / p).is_symlink())
    ]


def copy_tree(dest: Path, rev: str | None, overlay: list[Path]) -> None:
    """Lay `COPIED` into `dest`: the working tree's files, or commit `rev`'s plus `overlay`."""
    if rev is None:
        for rel in tracked_files():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, target)
        return
    dest.mkdir(parents=True)
    archive = git("archive", "--format=tar", rev, "--", *COPIED)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    for rel in overlay:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)


PYTEST_ARGS = ("--runtime-device=cpu", "-p", "no:cacheprovider")
PRE_RUN_ARGS = ("-q", "-rfE", "--tb=no", "--continue-on-collection-errors")
# CUDA hidden (the CPU tier); one torch thread per run, since mutmut runs several at once.
ENV = {
    **os.environ,
    "CUDA_VISIBLE_DEVICES": "",
    "PYTHONDONTWRITEBYTECODE": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def mutmut_config(module: str, tests: list[str], deselect: list[str], slack: float) -> str:
    """setup.cfg text that points mutmut at one module and its own tests.

    `slack` is mutmut's timeout_multiplier: a mutant's run may take that many times its tests'
    unmutated time (plus a second) before it counts as a timeout.
    """
    lines = [
        "[mutmut]",
        "source_paths = reference",
        f"only_mutate = reference/{STEP[module]}/{module}.py",
        f"timeout_multiplier = {slack}",
        "also_copy =\n    fakes\n    tests",
        "pytest_add_cli_args_test_selection =",
        *(f"    {t}" for t in tests),
        "pytest_add_cli_args =",
        *(f"    {a}" for a in PYTEST_ARGS),
        *(f"    --deselect={d}" for d in deselect),
    ]
    return "\n".join(lines) + "\n"


def failing_tests(copy: Path, tests: list[str]) -> tuple[list[str], list[str]]:
    """(test files that do not import, test ids that fail) when the copy runs unmutated."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *tests, *PYTEST_ARGS, *PRE_RUN_ARGS],
        cwd=copy,
        env=ENV,
        capture_output=True,
        text=True,
        check=False,
    )
    broken: list[str] = []
    failed: list[str] = []
    for line in done.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word not in ("FAILED", "ERROR"):
            continue
        node = rest.split(" - ", 1)[0].strip()
        (failed if "::" in node else broken).append(node)
    return broken, failed


def prepare(work: Path, module: str, tests: list[str], source: Source) -> tuple[Path, list[str]]:
    """A fresh copy of the tree in `work/module`, configured for mutmut.

    With `source.deselect_failing`, tests that fail unmutated are left out (and returned, as
    "file" or "file::test"), so that a tree in the middle of an edit can still be measured.
    """
    dest = work / module
    if dest.exists():
        shutil.rmtree(dest)
    copy_tree(dest, source.rev, source.overlay)
    left_out: list[str] = []
    deselect: list[str] = []
    if source.deselect_failing:
        broken, deselect = failing_tests(dest, tests)
        tests = [t for t in tests if t not in broken]
        left_out = broken + deselect
    (dest / "setup.cfg").write_text(mutmut_config(module, tests, deselect, source.slack))
    return dest, left_out


def mutmut(copy: Path, *args: str, timeout: float | None = None) -> str:
    """Run the mutmut next to this interpreter in `copy`; returns its output."""
    exe = Path(sys.executable).with_name("mutmut")
    done = subprocess.run(
        [str(exe), *args],
        cwd=copy,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    out = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"mutmut {' '.join(args)} exited {done.returncode}:\n{out}")
    return out


def survivors(copy: Path) -> dict[str, str]:
    """Each not-killed mutant's name -> its status (from `mutmut results`)."""
    found: dict[str, str] = {}
    for line in mutmut(copy, "results").splitlines():
        name, sep, status = line.strip().partition(": ")
        if sep and name.startswith("reference."):
            found[name] = status.strip()
    return found


def run_module(
    module: str, *, work: Path, out: Path, children: int, limit: float, source: Source
) -> Score:
    """Mutate one module against its own tests; writes its survivors' diffs under `out`."""
    tests = [f"tests/unit/{t}" for t in MODULES[module] if (ROOT / "tests" / "unit" / t).is_file()]
    start = time.monotonic()
    copy, left_out = prepare(work, module, tests, source)
    (out / f"{module}.left-out.txt").write_text("".join(f"{t}\n" for t in left_out))
    log = out / f"{module}.log"
    try:
        text = mutmut(copy, "run", "--max-children", str(children), timeout=limit)
        log.write_text(text)
        if "failed to collect stats" in text or "Failed to run clean test" in text:
            raise RuntimeError(f"the module's tests fail unmutated: see {log}")
        mutmut(copy, "export-cicd-stats")
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        if not log.exists():
            log.write_text(str(exc))
        return Score(module, 0, 0, 0, 0, 0, 0, time.monotonic() - start, f"see {log}")
    seconds = time.monotonic() - start
    stats = json.loads((copy / "mutants" / "mutmut-cicd-stats.json").read_text())
    left = survivors(copy)
    with (out / f"{module}.survivors.txt").open("w") as fh:
        for name, status in sorted(left.items()):
            fh.write(f"## {name} ({status})\n{mutmut(copy, 'show', name)}\n")
    known = stats["killed"] + stats["survived"] + stats["no_tests"] + stats["timeout"]
    return Score(
        module=module,
        total=stats["total"],
        killed=stats["killed"],
        survived=stats["survived"],
        no_tests=stats["no_tests"],
        timeout=stats["timeout"],
        other=stats["total"] - known,
        seconds=seconds,
        left_out=len(left_out),
    )


def table(scores: list[Score]) -> str:
    """The per-module score table, as Markdown."""
    rows = [
        "| module | mutants | killed | survived | no tests | timeout | other | score % | time s"
        " | tests left out |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in scores:
        if s.error:
            rows.append(f"| {s.module} | error: {s.error.splitlines()[0]} | | | | | | | | |")
            continue
        rows.append(
            f"| {s.module} | {s.total} | {s.killed} | {s.survived} | {s.no_tests} | {s.timeout}"
            f" | {s.other} | {s.score:.1f} | {s.seconds:.0f} | {s.left_out} |"
        )
    good = [s for s in scores if not s.error]
    total = sum(s.total for s in good)
    killed = sum(s.killed + s.timeout for s in good)
    if total:
        rows.append(
            f"| **all** | {total} | | | | | | {100.0 * killed / total:.1f}"
            f" | {sum(s.seconds for s in good):.0f} | {sum(s.left_out for s in good)} |"
        )
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Parse options, run each module in turn, print and write the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help=f"default: all of {', '.join(MODULES)}")
    parser.add_argument("--work", type=Path, default=Path("/tmp/mutation-work"))
    parser.add_argument("--out", type=Path, default=Path("/tmp/mutation-out/scores.md"))
    parser.add_argument("--max-children", type=int, default=2, help="parallel mutant runs")
    parser.add_argument("--limit", type=float, default=1800.0, help="seconds per module")
    parser.add_argument("--rev", help="copy this commit instead of the working tree")
    parser.add_argument(
        "--overlay", nargs="*", type=Path, default=[], help="with --rev: working-tree files added"
    )
    parser.add_argument(
        "--timeout-multiplier",
        type=float,
        default=40.0,
        help="mutmut's timeout_multiplier (its default, 15, misfires on a loaded machine)",
    )
    parser.add_argument(
        "--deselect-failing",
        action="store_true",
        help="leave out tests that fail unmutated (listed in <module>.left-out.txt) instead of"
        " stopping; for a tree in the middle of an edit",
    )
    opts = parser.parse_args(argv)
    unknown = set(opts.modules) - set(MODULES)
    if unknown:
        parser.error(f"unknown modules {sorted(unknown)}; choose from {list(MODULES)}")
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.work.mkdir(parents=True, exist_ok=True)
    scores: list[Score] = []
    for module in opts.modules or list(MODULES):
        (opts.out.parent / f"{module}.log").unlink(missing_ok=True)
        source = Source(opts.rev, opts.overlay, opts.deselect_failing, opts.timeout_multiplier)
        score = run_module(
            module,
            work=opts.work,
            out=opts.out.parent,
            children=opts.max_children,
            limit=opts.limit,
            source=source,
        )
        scores.append(score)
        print(f"{module}: {score.score:.1f}% of {score.total} ({score.seconds:.0f}s)", flush=True)
        opts.out.write_text(table(scores))
    print(table(scores), end="")
    print(f"table: {opts.out}; survivors' diffs and logs: {opts.out.parent}")
    return 1 if any(s.error for s in scores) else 0


if __name__ == "__main__":
    sys.exit(main())
