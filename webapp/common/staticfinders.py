"""Static files that come from installed Python packages rather than from the tree.

plotly.js is served from the pinned ``plotly`` package (requirements.txt), its own bundle byte
for byte, as ``vendor/plotly.min.js``: the dashboard's pages and the run report use the same
file, and no copy of it is kept in the repository. ``{% static %}``, ``collectstatic``,
``findstatic`` and the server's static handler all find it through this finder.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from django.contrib.staticfiles import utils
from django.contrib.staticfiles.finders import BaseFinder
from django.core.checks import CheckMessage, Error
from django.core.files.storage import FileSystemStorage

# served name -> (package, file inside the package)
PACKAGE_FILES: dict[str, tuple[str, str]] = {
    "vendor/plotly.min.js": ("plotly", "package_data/plotly.min.js"),
}


def package_file(package: str, relative: str) -> Path | None:
    """Where ``relative`` lies in the installed ``package`` (None: the package is missing).
    The package is located, not imported."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / relative


class PackageFileFinder(BaseFinder):
    """Finds the files of :data:`PACKAGE_FILES` under their served names."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.files: dict[str, Path | None] = {}
        for served, (package, relative) in PACKAGE_FILES.items():
            if PurePosixPath(served).name != PurePosixPath(relative).name:
                raise ValueError(f"{served}: a package file keeps its name ({relative})")
            self.files[served] = package_file(package, relative)

    def check(self, **kwargs: Any) -> list[CheckMessage]:
        errors: list[CheckMessage] = []
        for served, path in self.files.items():
            if path is None or not path.is_file():
                package, relative = PACKAGE_FILES[served]
                errors.append(Error(
                    f"static file {served} is missing: {package}'s {relative} not found",
                    hint="pip install -r requirements.txt", id="edgepipe.E001"))
        return errors

    def find(self, path: str, find_all: bool = False, **kwargs: Any) -> str | list[str]:
        found = self.files.get(path)
        matches = [str(found)] if found is not None and found.is_file() else []
        if find_all or kwargs.get("all"):
            return matches
        return matches[0] if matches else []

    def list(self, ignore_patterns: list[str] | None) -> Iterator[tuple[str, FileSystemStorage]]:
        for served, path in self.files.items():
            if path is None or not path.is_file():
                continue
            if utils.matches_patterns(served, ignore_patterns or []):
                continue
            storage = FileSystemStorage(location=path.parent)
            # collectstatic copies the file to <prefix>/<name>, its served name
            storage.prefix = str(PurePosixPath(served).parent)
            yield path.name, storage
