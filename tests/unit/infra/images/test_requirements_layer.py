"""A script's requirements layer (infra/images/requirements_layer.py): its tag names what it adds, and its context
installs the fetched wheels from no index over the image."""

from infra.images.requirements_layer import layer_context, layer_tag


def test_the_layers_tag_changes_with_the_requirements_and_the_lock_only(tmp_path):
    lock = tmp_path / "constraints.txt"
    lock.write_text("termcolor==3.3.0\n")
    tag = layer_tag("abc123", ["termcolor", "six"], lock)
    assert tag.startswith("abc123-req") and tag == layer_tag("abc123", ["six", "termcolor"], lock)
    assert tag != layer_tag("abc123", ["termcolor"], lock) and tag != layer_tag("def456", ["termcolor", "six"], lock)
    lock.write_text("termcolor==3.2.0\n")
    assert tag != layer_tag("abc123", ["termcolor", "six"], lock)


def test_the_layers_context_installs_its_wheels_from_no_index_over_the_image(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "termcolor-3.3.0-py3-none-any.whl").write_bytes(b"wheel")
    (wheels / ".complete").write_text("key")
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "stale").write_text("from an earlier build")
    context = layer_context(tmp_path / "ctx", "registry/trainflow-cpu:abc123", ["termcolor"], wheels)
    dockerfile = (context / "Dockerfile").read_text()
    assert dockerfile.startswith("FROM registry/trainflow-cpu:abc123\n")
    assert "pip install --no-index --find-links /tmp/wheels -r /opt/trainflow/script-requirements.txt" in dockerfile
    assert (context / "requirements.txt").read_text() == "termcolor\n"
    assert sorted(p.name for p in (context / "wheels").iterdir()) == ["termcolor-3.3.0-py3-none-any.whl"]
    assert not (context / "stale").exists()
