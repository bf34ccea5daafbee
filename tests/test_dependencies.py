"""Every module the project imports is installed by ``pip install -e ".[test]"`` on a fresh machine.

A package present on the developer's machine but missing from ``setup.cfg`` passes every
other test here and fails only on a clean clone; this test reads the imports with ``ast``
and the requirements from ``setup.cfg`` itself, so it fails on the machine that added the import.
"""
import ast
import configparser
import importlib.metadata
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIRST_PARTY = {"seqapps", "pipelines", "tests"}
#: modules installed apart from setup.cfg, and why
INSTALLED_APART = {
    # TF Serving's stubs for tests/serving/tfs_api_client.py: .ci/run installs them with --no-deps, since the
    # package's requirements would add the full tensorflow beside tensorflow-cpu; the tests skip without them.
    "tensorflow_serving",
}


def imported_top_level_modules(folders: list[str]) -> dict[str, str]:
    """``{top-level module: first file importing it}`` for absolute imports under ``folders``."""
    found: dict[str, str] = {}
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


def declared_distributions() -> set[str]:
    """Normalised names of ``install_requires`` and every extra in ``setup.cfg``."""
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    lines = parser["options"]["install_requires"].splitlines()
    for extra in parser["options.extras_require"].values():
        lines += extra.splitlines()
    return {normalise(re.split(r"[<>=!~\[; ]", line.strip())[0]) for line in lines if line.strip()}


def normalise(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def test_every_third_party_import_is_a_declared_requirement():
    providers = importlib.metadata.packages_distributions()
    declared = declared_distributions() | {"tensorflow"}  # tensorflow-cpu provides the module
    undeclared = {}
    for module, where in imported_top_level_modules(["seqapps", "pipelines", "tests"]).items():
        if module in sys.stdlib_module_names or module in FIRST_PARTY or module in INSTALLED_APART:
            continue
        distributions = {normalise(name) for name in providers.get(module, [module])}
        if not distributions & declared:
            undeclared[module] = (where, sorted(distributions))
    assert not undeclared, f"imported but not in setup.cfg: {undeclared}"
