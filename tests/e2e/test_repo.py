"""Checks on the repository itself: the CI entry point, the import layering, the packaging."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]

# distribution -> (import name, native?, sibling distributions it depends on)
PACKAGES = {
    "ft-kernels-cpu": ("ft_kernels_cpu", True, set()),
    "ft-gpusync": ("ft_gpusync", True, {"ft-kernels-cpu"}),
    "ft-moe-runtime": ("ft_moe_runtime", False, {"ft-gpusync", "ft-kernels-cpu"}),
    "ft-models": ("ft_models", False, {"ft-moe-runtime"}),
    "ft-server": ("ft_server", False, {"ft-models"}),
}
TORCH_FREE = ["ft_kernels_cpu", "ft_gpusync"]


def _fenced_lines(markdown: str) -> list[str]:
    """Every non-empty line inside a ``` fenced block."""
    lines, inside = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            inside = not inside
        elif inside and line.strip():
            lines.append(line.strip())
    return lines


def _readme_test_command() -> str:
    commands = [line for line in _fenced_lines((ROOT / "README.md").read_text()) if "nox -s tests" in line]
    assert len(commands) == 1, f"README.md should hold exactly one `nox -s tests` command, found {commands}"
    return commands[0]


def _ci_commands() -> list[str]:
    """The lines .ci/run executes besides its shell setup (set, cd, trap)."""
    commands = []
    for line in (ROOT / ".ci" / "run").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or re.match(r"(set|cd|trap)\s", line):
            continue
        commands.append(line)
    return commands


def test_ci_runs_exactly_the_readme_test_command():
    assert _ci_commands() == [_readme_test_command()]


def test_readme_test_command_installs_nox_then_runs_the_tests_session():
    assert _readme_test_command() == "python3 -m pip install nox && nox -s tests"


def test_ci_script_is_executable_and_strict():
    script = ROOT / ".ci" / "run"
    assert script.stat().st_mode & 0o111, ".ci/run is not executable"
    assert "set -euo pipefail" in script.read_text()


@pytest.mark.parametrize("module", TORCH_FREE)
def test_native_layers_do_not_import_torch(module):
    # A fresh interpreter: this pytest process may hold torch already. The tests session installs all
    # five packages, so a missing one is a failure here, not a skip.
    code = f"import sys, {module}; print(sorted(m for m in ('torch', 'triton') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, f"import {module} failed:\n{out.stderr}"
    assert out.stdout.strip() == "[]", f"import {module} pulled in {out.stdout.strip()}"


def _pyproject(dist: str) -> dict:
    return tomllib.loads((ROOT / "packages" / dist / "pyproject.toml").read_text())


def test_every_package_directory_is_known():
    found = {p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists()}
    assert found == set(PACKAGES)


@pytest.mark.parametrize("dist", list(PACKAGES))
def test_pyproject_builds_with_scikit_build_core(dist):
    import_name, native, _ = PACKAGES[dist]
    config = _pyproject(dist)
    build_system = config["build-system"]
    assert build_system["build-backend"] == "scikit_build_core.build"
    requires = {Requirement(r).name: Requirement(r) for r in build_system["requires"]}
    assert "scikit-build-core" in requires
    assert ("pybind11" in requires) == native
    assert config["project"]["name"] == dist
    skbuild = config["tool"]["scikit-build"]
    assert skbuild["minimum-version"] == "build-system.requires"
    assert skbuild["build-dir"] == "build/{wheel_tag}"
    assert skbuild["wheel"]["packages"] == [f"src/{import_name}"]
    assert skbuild["wheel"].get("cmake", True) == native
    assert (ROOT / "packages" / dist / "CMakeLists.txt").exists() == native


@pytest.mark.parametrize("dist", list(PACKAGES))
def test_siblings_pinned_compatibly_and_only_downwards(dist):
    requirements = [Requirement(r) for r in _pyproject(dist)["project"].get("dependencies", [])]
    siblings = {r.name: r for r in requirements if r.name in PACKAGES}
    assert set(siblings) == PACKAGES[dist][2]
    for name, req in siblings.items():
        sibling_version = _pyproject(name)["project"]["version"]
        specs = list(req.specifier)
        assert [s.operator for s in specs] == ["~="], f"{dist} pins {req}; expected {name}~={sibling_version}"
        assert Version(specs[0].version) == Version(sibling_version)
    if PACKAGES[dist][0] in TORCH_FREE:
        assert not {r.name for r in requirements} & {"torch", "triton"}
