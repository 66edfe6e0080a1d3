"""What a wheel holds: every file of ``dpsbi/`` that is not a module is declared as package data, and the
Hydra configs are found inside the package (an installed wheel has no repository root). ``make wheel-check``
builds and installs the wheel itself."""

import importlib
import re
import tomllib
import types
from pathlib import Path

import dpsbi
from dpsbi.experiment import config_dir

ROOT = Path(__file__).resolve().parents[1]
#: The modules whose public names the API reference (``docs/api/``, built by ``make docs``) renders.
PUBLIC_MODULES = (
    "dpsbi",
    "dpsbi.mechanisms",
    "dpsbi.tasks",
    "dpsbi.inference",
    "dpsbi.baselines",
    "dpsbi.diagnostics",
    "dpsbi.metrics",
    "dpsbi.experiment",
    "dpsbi.cli",
)


def declared_package_data() -> set[Path]:
    """The files that ``pyproject.toml``'s package-data globs pick out of the source tree."""
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    return {
        path
        for package, patterns in settings.items()
        for pattern in patterns
        for path in (ROOT / package.replace(".", "/")).glob(pattern)
    }


def test_every_data_file_of_the_package_is_package_data():
    files = {p for p in (ROOT / "dpsbi").rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    data = {p for p in files if p.suffix not in (".py", ".pyc")}
    assert {p.name for p in data} >= {"config.yaml", "py.typed", "outbreaks.json", "sir_eps1.csv"}
    assert not data - declared_package_data(), "not declared in pyproject.toml's package-data"


def test_the_configs_are_found_inside_the_package(monkeypatch):
    monkeypatch.delenv("DPSBI_CONFIG_DIR", raising=False)
    assert config_dir() == Path(dpsbi.__file__).resolve().parent / "configs"


def test_the_version_has_a_changelog_entry():
    assert f"\n## {dpsbi.__version__}\n" in (ROOT / "CHANGELOG.md").read_text()


def test_the_api_reference_renders_every_public_module():
    """Each public module has its ``::: module`` directive; a name of ``__all__`` that is also the name of a
    submodule (``dpsbi.baselines.abcdp``) is hidden by that submodule in the package's rendering, so it needs
    its own directive (``::: dpsbi.baselines.abcdp.abcdp``)."""
    pages = "\n".join(p.read_text() for p in (ROOT / "docs" / "api").glob("*.md"))
    directives = set(re.findall(r"^::: (\S+)$", pages, re.M))
    assert set(PUBLIC_MODULES) <= directives
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        folder = Path(module.__file__).parent
        shadowed = [
            n
            for n in getattr(module, "__all__", ())
            if (folder / f"{n}.py").is_file() and not isinstance(getattr(module, n), types.ModuleType)
        ]
        assert all(f"{name}.{n}.{n}" in directives for n in shadowed), f"{name}: {shadowed}"


def test_the_lowest_environment_pins_every_lower_bound():
    """``make test-lowest`` tests the lower bounds of ``pyproject.toml``: ``.ci/lowest.txt`` pins each
    ``name>=X`` of the dependencies and the test extra at exactly X (torch: the Makefile's ``TORCH``). A bound
    changed without rerunning ``.ci/lock_lowest.py`` fails here."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", (ROOT / ".ci" / "lowest.txt").read_text(), re.M))
    pins["torch"] = re.search(r"^TORCH \?= torch==(\S+)$", (ROOT / "Makefile").read_text(), re.M)[1]

    def release(version: str) -> tuple[int, ...]:
        parts = tuple(int(p) for p in version.split("+")[0].split("."))
        return parts + (0,) * (3 - len(parts))

    floors = [
        re.match(r"^([A-Za-z0-9_.-]+)>=([0-9.]+)", r)
        for r in project["dependencies"] + project["optional-dependencies"]["test"]
    ]
    floors = [m for m in floors if m]
    assert {m[1] for m in floors} >= {"torch", "numpy", "sbi", "arviz", "hydra-core", "opendp"}
    for m in floors:
        assert m[1] in pins and release(pins[m[1]]) == release(m[2]), (m[1], m[2], pins.get(m[1]))
