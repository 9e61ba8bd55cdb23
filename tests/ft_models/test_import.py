import importlib.metadata

import ft_models


def test_version_matches_installed_metadata():
    assert ft_models.__version__ == importlib.metadata.version("ft-models")


def test_has_no_public_api_yet():
    assert ft_models.__all__ == []
