import importlib.metadata

import ft_moe_runtime


def test_version_matches_installed_metadata():
    assert ft_moe_runtime.__version__ == importlib.metadata.version("ft-moe-runtime")


def test_has_no_public_api_yet():
    assert ft_moe_runtime.__all__ == []
