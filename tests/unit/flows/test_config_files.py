"""A config file that holds no settings, or sets one key twice, is refused naming the file (and the key and its
lines), where PyYAML would give an empty config or keep the last value without a word."""

import pytest

from flows.config import ConfigError, load_config


def refusal(path, text: str) -> str:
    """The error loading a config file that holds `text` ends in."""
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_config(path, {}, environ={})
    return str(refused.value)


@pytest.mark.parametrize("text", ["", "\n\n", "# training: {epochs: 3}\n", "---\n"])
def test_an_empty_config_file_says_it_is_empty(tmp_path, text):
    path = tmp_path / "c.yaml"
    assert refusal(path, text) == (
        f"config file {path} is empty (it holds no settings, only blank lines or comments); write settings in it "
        "such as `training: {epochs: 3}`, or leave out --config"
    )


@pytest.mark.parametrize(
    "text, where, key, first",
    [
        ("training:\n  epochs: 3\n  batch_size: 4\n  epochs: 5\n", "line 4, column 3", "epochs", 2),
        ("training: {epochs: 3}\npool: {nodes: 1}\ntraining: {lr: 0.1}\n", "line 3, column 1", "training", 1),
        ("training: {epochs: 3, epochs: 4}\n", "line 1, column 23", "epochs", 1),
    ],
)
def test_a_key_set_twice_is_refused_naming_the_key_its_lines_and_the_file(tmp_path, text, where, key, first):
    path = tmp_path / "c.yaml"
    assert refusal(path, text) == (
        f"config file {path} is not valid YAML at {where}: {key} is set twice (first on line {first}); keep one of "
        "the two"
    )


def test_the_same_key_in_two_sections_is_no_duplicate(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("storage: {backend: azurite}\nfileshare: {backend: local}\n")
    assert load_config(path, {}, environ={}).fileshare.backend == "local"
