import importlib.metadata

import ft_server


def test_version_matches_installed_metadata():
    assert ft_server.__version__ == importlib.metadata.version("ft-server")


def test_has_no_public_api_yet():
    assert ft_server.__all__ == []
