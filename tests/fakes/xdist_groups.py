"""How the suite shares its tests among pytest-xdist's workers: the tests of a group run on one worker, every other
test wherever a worker is free.

pytest-xdist's controller, which hands the tests out, sees only their node ids; the fixtures a test uses and its
marks are known in the workers, which collect. So a group is named by its modules' paths (as node ids write them,
from the rootdir), and `GroupedScheduling` (pytest-xdist's public `pytest_xdist_make_scheduler` hook, for
`--dist load` and `--dist loadgroup`) makes each group one unit of work, each other test a unit of its own. The
workers check, at collection, that every test that needs its group is in a module of that group: a test that uses
a group's fixture (`docker_engine`: one dockerd) or whose module marks itself `xdist_group(name)` (one costly
module fixture), else the run stops before any test, naming the module and the group.

This replaces pytest-xdist's own `--dist loadgroup`, which puts the group in the node id by writing `item._nodeid`:
pytest 9.2 reads `item._id`, so that scheduler sees no group at all, and nothing here writes pytest's private
attributes. The one method overridden, `_split_scope`, is pytest-xdist's own extension point: its `loadscope`,
`loadfile` and `loadgroup` schedulers are each that override of `LoadScopeScheduling`.

    config.pluginmanager.register(Groups({"tests/x/test_images.py": "docker"}, {"docker_engine": "docker"}))
"""

from collections.abc import Mapping

import pytest
from xdist.scheduler import LoadScopeScheduling

GROUPED_DISTS = ("load", "loadgroup")  # --dist modes that get the groups; an explicit other mode is honoured


def module_of(nodeid: str) -> str:
    """The module path of a test's node id: `tests/unit/test_x.py::test_y[1]` -> `tests/unit/test_x.py`."""
    return nodeid.split("::", 1)[0]


class GroupedScheduling(LoadScopeScheduling):
    """pytest-xdist's scope scheduling with one scope per group (all its modules' tests) and one per other test. The
    scopes go out largest first (pytest-xdist's `--loadscope-reorder`, on by default): the groups, the longest work,
    start at once, and the workers take the rest a test at a time."""

    def __init__(self, config: pytest.Config, log, modules: Mapping[str, str]) -> None:
        super().__init__(config, log)
        self.modules = modules

    def _split_scope(self, nodeid: str) -> str:
        group = self.modules.get(module_of(nodeid))
        return f"group {group}" if group else nodeid


class Groups:
    """The plugin: `modules` maps a module's path (from the rootdir) to its group; `fixtures` maps a fixture to the
    group every test that uses it must be in."""

    def __init__(self, modules: Mapping[str, str], fixtures: Mapping[str, str]) -> None:
        self.modules, self.fixtures = dict(modules), dict(fixtures)

    @pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent under -p no:xdist
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log) -> LoadScopeScheduling | None:
        if config.getvalue("dist") not in GROUPED_DISTS:
            return None
        return GroupedScheduling(config, log, self.modules)

    def needs(self, item: pytest.Item) -> set[str]:
        """The groups a test must be in: its fixtures' and its module's `xdist_group` mark's."""
        fixtures = set(getattr(item, "fixturenames", ()))
        wanted = {group for fixture, group in self.fixtures.items() if fixture in fixtures}
        for mark in item.iter_markers("xdist_group"):
            wanted.add(str(mark.args[0] if mark.args else mark.kwargs.get("name", "default")))
        return wanted

    def misplaced(self, items: list[pytest.Item]) -> list[str]:
        """One line per module holding a test that is not in the group it needs."""
        found = {}
        for item in items:
            module = module_of(item.nodeid)
            for group in sorted(self.needs(item) - {self.modules.get(module)}):
                found.setdefault((module, group), item.nodeid)
        return [
            f"{test} needs group {group!r}, but its module {module} is "
            + (f"in group {self.modules[module]!r}" if module in self.modules else "in no group")
            for (module, group), test in sorted(found.items())
        ]

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        problems = self.misplaced(items)
        if problems:  # a collection error, which every worker reports; and no test runs
            why = (
                "a test that shares one worker's resource must be in a module of its group (tests/conftest.py's GROUPS)"
            )
            report = pytest.CollectReport(
                "xdist groups", "failed", "\n".join([f"tests outside the group they need: {why}", *problems]), []
            )
            config.hook.pytest_collectreport(report=report)
            items.clear()
            return
        items.sort(key=lambda item: module_of(item.nodeid) not in self.modules)  # stable: the groups first
