"""Which SGLang the server process will run: `serve.python` with `serve.env`, asked before any stage starts.

On a GPU machine SGLang often lives in a site of its own (its transformers pin clashes with draftlab's), so the
package draftlab's process imports says nothing about the server's. The interpreter is asked where sglang is and
which version it has, without importing it (an import takes 20 s and loads CUDA).
"""

from __future__ import annotations

import subprocess
from typing import Any

from draftlab.sglang.bench import server_env
from draftlab.sglang.contract import find_sglang


class ServerPythonError(ValueError):
    """serve.python cannot run SGLang; the message names the key."""


def server_sglang(serve: Any, timeout_s: float = 60.0) -> tuple[str, str]:
    """(sglang's __init__.py, its version) as the server process will see them; ServerPythonError otherwise."""
    python = str(serve.python or "python")
    try:
        found = find_sglang(python, server_env(serve), timeout_s)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ServerPythonError(f"serve.python: {python!r} cannot be run ({err})") from None
    except subprocess.CalledProcessError as err:
        raise ServerPythonError(f"serve.python: {python!r} failed: {err.stderr.strip().splitlines()[-1:]}") from None
    if found is None:
        raise ServerPythonError(f"serve.python: {python!r} cannot import sglang (with serve.env "
                                f"{dict(serve.env or {})}); install it there, or point serve.python or "
                                "+serve.env.PYTHONPATH at an interpreter or site that has it")
    return str(found[0] / "__init__.py"), found[1]
