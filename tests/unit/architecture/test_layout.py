"""The package's shape: imports go down the layers and never in a circle; the fit's run record never
reaches back into the rounds; no class is spread over mixins."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "mpi_trainer"
# Lower layers never import higher ones; a layer may import its own modules and anything below.
LAYERS = [
    {"errors", "logs", "hooks"},
    {"config"},
    {"algorithms"},
    {"comm"},
    {"data", "models"},
    {"persistence"},
    {"reporting"},
    {"launch"},
    {"trainer"},
    {"api"},
    # the package's front door re-exports the Python API
    {"cli", "__main__", "__init__"},
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__init__"
    return next(index for index, names in enumerate(LAYERS) if top in names)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The package modules ``path`` imports (``from pkg import submodule`` counts as the submodule).

    Imports under ``if TYPE_CHECKING:`` count too: a cycle hidden there is still a cycle in the design.
    """
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mpi_trainer"):
            found.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                         for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("mpi_trainer"))
    return found


def graph() -> dict[str, set[str]]:
    paths = list(PACKAGE.rglob("*.py"))
    modules = {module_name(path) for path in paths}
    return {module_name(path): imports(path, modules) for path in paths}


def test_every_top_level_name_has_a_layer():
    for module in graph():
        layer(module)  # raises StopIteration for a module outside the table


def test_no_import_goes_up_a_layer():
    upward = [(module, target) for module, targets in graph().items() for target in targets
              if target != "mpi_trainer" and layer(target) > layer(module)]
    assert not upward, upward


def test_no_import_cycle_between_modules():
    edges = graph()

    def visit(module: str, trail: list[str]) -> None:
        for target in sorted(edges.get(module, ())):
            if target in trail:
                raise AssertionError(" -> ".join([*trail[trail.index(target):], target]))
            visit(target, [*trail, target])

    for module in sorted(edges):
        visit(module, [module])


# The rounds own an epoch; the run record (rounds.csv, summary.json, checkpoints) is a sink that takes
# finished epochs and never calls back into the rounds.
ROUND_MODULES = {f"mpi_trainer.trainer.{name}"
                 for name in ("fit", "scheduler", "worker", "round_protocol", "ssp", "lbfgs", "config_fit")}
WRITER_MODULES = {"mpi_trainer.trainer.run_record"}


def test_the_run_record_imports_no_round():
    edges = graph()
    reached = {module: sorted(edges[module] & ROUND_MODULES) for module in WRITER_MODULES}
    assert reached == {module: [] for module in WRITER_MODULES}


def classes() -> dict[str, list[tuple[Path, ast.ClassDef]]]:
    """Every class the package defines, by name (a name defined in two modules lists both)."""
    found: dict[str, list[tuple[Path, ast.ClassDef]]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append((path, node))
    return found


def declared_names(node: ast.ClassDef) -> set[str]:
    """What a class declares itself: its methods, class attributes and annotated fields."""
    names = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
        elif isinstance(item, ast.Assign):
            names.update(target.id for target in item.targets if isinstance(target, ast.Name))
    return names


def self_attributes(node: ast.ClassDef) -> set[str]:
    """The ``self.<name>`` a class's methods read or write."""
    return {sub.attr for sub in ast.walk(node) if isinstance(sub, ast.Attribute)
            and isinstance(sub.value, ast.Name) and sub.value.id == "self"}


def is_mixin(node: ast.ClassDef) -> bool:
    """A class with no base of its own whose methods use a ``self.<name>`` it never declares or assigns:
    a part of another class, living elsewhere (a subclass inherits what it uses; an ABC, a Protocol, an
    Enum or an exception declares it)."""
    if node.bases:
        return False
    assigned = {sub.attr for sub in ast.walk(node) if isinstance(sub, ast.Attribute)
                and isinstance(sub.value, ast.Name) and sub.value.id == "self" and isinstance(sub.ctx, ast.Store)}
    return bool(self_attributes(node) - declared_names(node) - assigned)


def test_no_class_is_spread_over_mixins():
    """A base class that reads attributes only its subclass sets is one class cut in parts:
    collaborators are held, not inherited."""
    defined = classes()
    mixins = sorted(f"{path.relative_to(PACKAGE.parent)}: {node.name}({base.id})"
                    for same_name in defined.values() for path, node in same_name for base in node.bases
                    if isinstance(base, ast.Name) and any(is_mixin(other) for _, other in defined.get(base.id, [])))
    assert not mixins, mixins
