"""scripts/kernels-ab run: order of the runs in a round, variants with environment settings, the
paired summary, and its errors. The exports under .ab/ are stand-in packages whose `bench` prints a
known ratio (and logs which export ran with which settings), so every expected value is set here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

BENCH = textwrap.dedent(
    """
    import json, os, sys
    RATIO = {ratio}
    ratio = RATIO + float(os.environ.get("FT_FAKE_BUMP", "0"))
    with open(os.environ["FT_FAKE_LOG"], "a") as f:
        f.write("{name} " + os.environ.get("FT_FAKE_BUMP", "-") + "\\n")
    print("# stderr line", file=sys.stderr)
    print(json.dumps({{"format": "nvfp4", "shape": "s", "threads": 2, "batch": 1, "routing": "distinct",
                      "ratio": ratio, "us_per_step": 100.0 / ratio}}))
    """
)


def export(root: Path, name: str, ratio: float) -> None:
    pkg = root / ".ab" / name / "ft-kernels-cpu"
    (pkg / "ft_kernels_cpu").mkdir(parents=True)
    (pkg / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "ft-kernels-cpu"\nversion = "0.0.0"\n'
        '[tool.setuptools]\npackages = ["ft_kernels_cpu"]\n'
    )
    (pkg / "ft_kernels_cpu" / "__init__.py").write_text("")
    (pkg / "ft_kernels_cpu" / "bench.py").write_text(BENCH.format(ratio=ratio, name=name))
    (root / ".ab" / name / "stamp").write_text(f"{name}\n1\n")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    # The stand-ins build with setuptools (a test dependency in noxfile.py; the GPU machine's Python
    # may lack it, as it lacks gguf).
    pytest.importorskip("setuptools", reason="the stand-in exports build with setuptools")
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "kernels-ab", root / "scripts" / "kernels-ab")
    export(root, "A", 0.5)
    export(root, "B", 0.625)
    return root


def run(root: Path, rounds: int, variants: str, **env: str) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if k != "FT_FAKE_BUMP"}
    e.update(FT_PYTHON=sys.executable, FT_AB_WORK=str(root / "work"), FT_AB_VARIANTS=variants,
             FT_FAKE_LOG=str(root / "runs.log"), **env)
    script = str(root / "scripts" / "kernels-ab")
    cmd = ["bash", script, "run", str(root / "out"), str(rounds), "--", "--format", "nvfp4"]
    return subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=600)


def test_rounds_alternate_and_variants_carry_settings(tree: Path) -> None:
    r = run(tree, 3, "A B A@FT_FAKE_BUMP=0.25")
    assert r.returncode == 0, r.stderr + r.stdout
    # Odd rounds in the listed order, even rounds backwards; the setting reached only its variant.
    forward = ["A -", "B -", "A 0.25"]
    assert (tree / "runs.log").read_text().split("\n")[:-1] == forward + forward[::-1] + forward
    rows = [json.loads(line) for line in (tree / "out" / "ab.jsonl").read_text().splitlines()]
    got = [(d["round"], d["variant"], d["ratio"]) for d in rows]
    want = [(1, "A", 0.5), (1, "B", 0.625), (1, "A@FT_FAKE_BUMP=0.25", 0.75)]
    want += [(2, v, x) for _, v, x in want[::-1]] + [(3, v, x) for _, v, x in want]
    assert got == want
    # One build of A for its two variants.
    assert sorted(p.name for p in (tree / "out").glob("build-*.log")) == ["build-A.log", "build-B.log"]
    # The summary: medians, and each variant's paired difference against the first (A).
    lines = {ln.split()[5]: ln for ln in r.stdout.splitlines() if ln.startswith("nvfp4")}
    assert lines["A"].split()[-2:] == ["0.500", "3"]
    assert lines["B"].split()[7:] == ["0.625", "3", "+0.125", "(3", "of", "3)"]
    assert lines["A@FT_FAKE_BUMP=0.25"].split()[7:] == ["0.750", "3", "+0.250", "(3", "of", "3)"]


def test_fixed_order(tree: Path) -> None:
    r = run(tree, 2, "B A", FT_AB_ORDER="fixed")
    assert r.returncode == 0, r.stderr + r.stdout
    assert (tree / "runs.log").read_text().split() == ["B", "-", "A", "-", "B", "-", "A", "-"]
    lines = {ln.split()[5]: ln for ln in r.stdout.splitlines() if ln.startswith("nvfp4")}
    assert lines["A"].split()[7:] == ["0.500", "2", "-0.125", "(0", "of", "2)"]


@pytest.mark.parametrize(
    ("variants", "env", "message"),
    [
        ("A C", {}, "FT_AB_VARIANTS names 'C', which is not under .ab/"),
        ("A A@FT_FAKE_BUMP", {}, "FT_AB_VARIANTS entry 'A@FT_FAKE_BUMP': 'FT_FAKE_BUMP' is not NAME=VALUE"),
        ("A A@1X=2", {}, "'1X=2' is not NAME=VALUE"),
        ("A B", {"FT_AB_ORDER": "zigzag"}, "FT_AB_ORDER must be 'alternate' or 'fixed', got 'zigzag'"),
    ],
)
def test_bad_settings_are_named(tree: Path, variants: str, env: dict[str, str], message: str) -> None:
    r = run(tree, 1, variants, **env)
    assert r.returncode == 2
    assert message in r.stderr
    assert not (tree / "runs.log").exists()  # nothing ran
