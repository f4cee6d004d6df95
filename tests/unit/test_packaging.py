"""pyproject.toml lists every package and the data files the code reads, so a wheel (not only
the editable install the lab uses) holds the whole lab."""

import fnmatch
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
DATA_SUFFIXES = (".bpf.c", ".yaml", ".json")


def package_dirs():
    """{package name: folder} for every folder with an __init__.py under the mapped roots."""
    out = {}
    for root_name, folder in CONFIG["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            if root_name == "fabriclab" and rel.parts and f"fabriclab.{rel.parts[0]}" in CONFIG["package-dir"]:
                continue
            out[".".join((root_name, *rel.parts))] = init.parent
    return out


def test_every_package_is_listed():
    assert sorted(package_dirs()) == sorted(CONFIG["packages"])


def test_every_data_file_is_package_data():
    data = CONFIG["package-data"]
    missing = []
    for name, folder in package_dirs().items():
        for path in folder.rglob("*"):
            if not path.name.endswith(DATA_SUFFIXES) or "__pycache__" in path.parts:
                continue
            owner = max((p for p, f in package_dirs().items() if f in path.parents), key=len)
            rel = str(path.relative_to(package_dirs()[owner]))
            if owner == name and not any(fnmatch.fnmatch(rel, pat) for pat in data.get(owner, ())):
                missing.append(f"{owner}: {rel}")
    assert not missing, missing
