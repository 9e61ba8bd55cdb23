import importlib.metadata

import ft_moe_runtime


def test_version_matches_installed_metadata():
    assert ft_moe_runtime.__version__ == importlib.metadata.version("ft-moe-runtime")


def test_public_api():
    assert ft_moe_runtime.__all__ == ["ExpertSlotCache", "FetchPolicy", "LruReference"]
