"""Importing a user's module of ops to sweep (``tools/sweep.py --kernels``): TVM kernels
that register with ``@kernel``, torch custom ops that register with ``torch.library``."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

USER_PACKAGE = "metaspmd_user_kernels"  # a .py file is imported as USER_PACKAGE.<stem>


def load_module(ref: str) -> str:
    """Import ``ref``, a dotted module name or a .py file, and return the name it is
    registered under in ``sys.modules`` (what its ops' builders find it by)."""
    path = Path(ref)
    if ref.endswith(".py") or path.is_file() or "/" in ref or os.sep in ref:  # a path, not a module name
        if not path.is_file():
            raise FileNotFoundError(f"kernel module {ref} is a folder, not a .py file" if path.is_dir() else
                                    f"kernel module file not found: {ref}")
        name = f"{USER_PACKAGE}.{path.stem}"
        for known in (name, path.stem):  # by a neighbour's `import stem` too
            loaded = sys.modules.get(known)
            if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() == path.resolve():
                return known  # imported before: its ops registered then, and would clash now
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        # as a script run from its folder: the modules beside it import by their names
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        try:
            spec.loader.exec_module(module)
        except BaseException as e:
            sys.modules.pop(name, None)
            if isinstance(e, ImportError) and e.name == USER_PACKAGE:  # `from . import x`: no package around it
                raise ImportError(f"kernel module {ref} failed on import: a file given by path has no package for "
                                  "its relative imports: import its neighbours by name, or pass the module as a "
                                  "dotted name (pkg.kernels)") from e
            if isinstance(e, (Exception, SystemExit)):  # the file by name: the worker's report names only the backend
                raise ImportError(f"kernel module {ref} failed on import: {type(e).__name__}: {e}") from e
            raise
        if path.stem.isidentifier():  # a neighbour's `import stem` then finds it, not a second copy
            sys.modules.setdefault(path.stem, module)
        return name
    try:
        return importlib.import_module(ref).__name__
    except ImportError:
        raise
    except (Exception, SystemExit) as e:  # a module that calls sys.exit() on import
        raise ImportError(f"kernel module {ref} failed on import: {type(e).__name__}: {e}") from e


__all__ = ["USER_PACKAGE", "load_module"]
