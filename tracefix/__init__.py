"""tracefix: the packages ``daemon``, ``router``, ``trainer``, ``collectors`` and ``dashboard``,
imported as ``tracefix.daemon`` and so on so that they never collide with another distribution's
top-level modules (python-daemon's ``daemon``, for one).

Installed, the wheel holds them under this package (pyproject.toml). In a source checkout they stay
the repository's top-level folders, and this package's path is the repository root, so the same
imports work in both.
"""

from pathlib import Path

_HERE = Path(__file__).resolve().parent
if not (_HERE / "daemon").is_dir() and (_HERE.parent / "daemon" / "__init__.py").is_file():
    __path__.append(str(_HERE.parent))  # a source checkout
