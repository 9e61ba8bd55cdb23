import importlib.metadata
import subprocess
import sys

import ft_gpusync


def test_version_matches_installed_metadata():
    assert ft_gpusync.__version__ == importlib.metadata.version("ft-gpusync")


def test_public_api():
    assert ft_gpusync.__all__ == ["Coordinator", "CoordinatorError"]


def test_import_does_not_pull_in_torch():
    # A fresh interpreter: this pytest process may already hold torch for other tests.
    code = "import sys, ft_gpusync; print(sorted(m for m in ('torch', 'triton') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
