"""Every package of the product names each of its modules in its `__init__`'s docstring, so a
newcomer reads one index per folder instead of opening every file to learn what it holds."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("netconf", "cni_plugin")


def members(package: Path) -> list[str]:
    """The modules and subpackages directly in package."""
    names = [path.stem for path in package.glob("*.py") if path.name != "__init__.py"]
    names += [path.name for path in package.iterdir() if (path / "__init__.py").is_file()]
    return sorted(names)


def unnamed(package: Path) -> list[str]:
    """package's members its index does not name in code font (`name`, `name/`, `name.py`)."""
    index = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    return [name for name in members(package)
            if not re.search(rf"`(?:[\w/.]*/)?{re.escape(name)}(?:/|\.py)?`", index)]


def test_every_package_index_names_its_modules() -> None:
    missing = {f"{package.relative_to(REPO)}/__init__.py": unnamed(package)
               for top in PACKAGES for package in [REPO / top, *sorted((REPO / top).rglob("*"))]
               if (package / "__init__.py").is_file() and unnamed(package)}
    assert missing == {}, "name each module in its package's docstring (one line: what it holds)"


def test_the_check_sees_an_unnamed_module(tmp_path: Path) -> None:
    (tmp_path / "__init__.py").write_text('"""`named` and `sub/`; the word other is prose."""\n')
    for name in ("named.py", "other.py"):
        (tmp_path / name).write_text("")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "__init__.py").write_text("")
    assert unnamed(tmp_path) == ["other"]
