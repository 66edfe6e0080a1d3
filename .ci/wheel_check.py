"""dpsbi as a user gets it: run with the python of a fresh environment holding the built wheel (``make
wheel-check``), from an empty directory outside the repository. Fails when the installed package lacks a file
of the repository's ``dpsbi/`` (package data: configs, stored references, outbreak curves, ``py.typed``), or
when the README's quick start, ``dpsbi-run`` at a tiny budget or ``dpsbi-sample`` on that run fail there."""

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the pages' runner; dpsbi itself must come from the wheel

from docs_runner import blocks, run_block  # noqa: E402

#: ``dpsbi-run``'s default job (SPPE on regression) at a budget of seconds, unscored (no reference to compute).
TINY_RUN = (
    "budget.rounds=1 budget.sims_per_round=200 budget.max_steps=20 companions=[] reference.method=none "
    "hydra.run.dir=run"
)


def installed_package() -> Path:
    """The directory of the imported ``dpsbi``; refuses the repository's own copy."""
    import dpsbi

    package = Path(dpsbi.__file__).resolve().parent
    if package == ROOT / "dpsbi":
        sys.exit(f"wheel_check: dpsbi was imported from the repository ({package}), not from the wheel")
    return package


def missing_files(package: Path) -> list[str]:
    """The repository's files under ``dpsbi/`` (bytecode aside) that the installed package lacks."""
    source = ROOT / "dpsbi"
    files = (p.relative_to(source) for p in source.rglob("*") if p.is_file())
    return sorted(str(p) for p in files if "__pycache__" not in p.parts and not (package / p).is_file())


def check_data() -> None:
    """The outbreak curves and a stored reference are found and read through the library."""
    import dpsbi
    from dpsbi.experiment import stored_references

    dpsbi.tasks.load("sir_influenza")
    if stored_references.find(dpsbi.tasks.load("sir", epsilon=1.0)) is None:
        sys.exit("wheel_check: the stored SIR reference at epsilon 1 was not found in the installed package")


def main() -> None:
    package = installed_package()
    missing = missing_files(package)
    if missing:
        sys.exit(f"wheel_check: the wheel lacks {len(missing)} file(s) of dpsbi/: {', '.join(missing[:10])}")
    check_data()
    (quick_start,) = [code for language, code in blocks(ROOT / "README.md") if language == "python"]
    with tempfile.TemporaryDirectory() as work:
        cwd = Path(work)
        print(run_block("python", quick_start, cwd), end="")
        print(run_block("bash", f"dpsbi-run {TINY_RUN}", cwd)[-2000:], end="")
        print(run_block("bash", "dpsbi-sample run -n 100", cwd), end="")
    print(f"wheel_check: dpsbi from {package}: package data, quick start, dpsbi-run and dpsbi-sample passed")


if __name__ == "__main__":
    main()
