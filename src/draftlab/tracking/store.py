"""Checks of the MLflow store before MLflow touches it (tracking.open_store opens it with these).

Why this exists (issue 14):
- MLflow's HTTP client retries a dead server for minutes (255 s for `http://127.0.0.1:9`), and a read-only
  SQLite store took 108 s to fail; neither error named the setting to fix. Here a dead server is refused in
  milliseconds, a remote store that does not answer within `STORE_TIMEOUT_S` is refused, and a SQLite file
  that cannot be written is refused before MLflow touches it; each error names `tracking.uri`.
- A SQLite store whose folder does not exist is refused rather than made: a mistyped path would otherwise start a
  second store and split the runs across two without a word. Only the default store (mlruns/ in the project)
  is made.
- Two first jobs on a fresh SQLite file raced in MLflow's table creation (alembic), which left the store
  broken for good. The first open of a SQLite store therefore happens under a file lock beside the database.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import urllib.parse
from pathlib import Path

from draftlab.config.config import ConfigError

STORE_TIMEOUT_S = 10.0  # the whole check; the issue asks for a refusal within 15 s
CONNECT_TIMEOUT_S = 5.0

HINT = "fix tracking.uri (or MLFLOW_TRACKING_URI), or run with tracking.enabled=false and import-runs later"


class StoreError(ConfigError):
    """The tracking store cannot be used; the message names `tracking.uri`."""


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///` URI (query string dropped), else None."""
    if not uri.startswith("sqlite:///"):
        return None
    database = uri[len("sqlite:///"):].split("?", 1)[0]  # sqlite:////abs/path or sqlite:///relative
    return Path(database[len("file:"):] if database.startswith("file:") else database)  # SQLite URI filenames


def _probe_sqlite_write(uri: str, path: Path) -> None:
    """Writes the database header's user_version back unchanged and rolls back: a read-only file, folder or
    mount (or `mode=ro`) fails here, in milliseconds, instead of inside MLflow's first write."""
    database, _, query = uri[len("sqlite:///"):].partition("?")
    params = [p for p in query.split("&") if p and p != "uri=true"]
    as_uri = database.startswith("file:")
    target = (database + ("?" + "&".join(params) if params else "")) if as_uri else str(path)
    try:
        connection = sqlite3.connect(target, uri=as_uri, timeout=CONNECT_TIMEOUT_S)
        try:
            version = connection.execute("PRAGMA user_version").fetchone()[0]
            connection.execute("BEGIN IMMEDIATE")
            connection.execute(f"PRAGMA user_version = {int(version)}")  # a write, rolled back: nothing changes
            connection.rollback()
        finally:
            connection.close()
    except sqlite3.Error as err:
        raise StoreError(f"tracking.uri: the SQLite store {path} cannot be written ({err}); {HINT}") from None


def check_reachable(uri: str) -> None:
    """Cheap checks that need no MLflow: the HTTP server accepts a connection; the SQLite file is writable."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme in ("http", "https"):
        # MLflow's defaults (7 retries with backoff, 120 s per request) stall a job for minutes per call on a
        # store that went away mid-run; the job keeps what it cannot log (MlflowReporter), so fail faster.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT_S).close()
        except OSError as err:
            raise StoreError(f"tracking.uri: cannot reach the MLflow server at {uri} ({err}); {HINT}") from None
        return
    path = sqlite_path(uri)
    if path is None:
        return
    folder = path.parent
    if not folder.is_dir():
        if folder.absolute() != default_store_folder():
            raise StoreError(f"tracking.uri: the folder {folder} of the SQLite store does not exist (a typo?); create "
                             f"it to start a new store there, or {HINT}")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StoreError(f"tracking.uri: cannot create the folder of the SQLite store {path} ({err}); "
                             f"{HINT}") from None
    # SQLite writes a journal beside the database, so the folder must be writable as well as the file.
    for target in (folder, path) if path.exists() else (folder,):
        if not os.access(target, os.W_OK):
            raise StoreError(f"tracking.uri: the SQLite store {path} is read-only ({target} is not writable); "
                             f"{HINT}")
    _probe_sqlite_write(uri, path)


def default_store_folder() -> Path:
    """mlruns/ in the project: the store used when neither tracking.uri nor MLFLOW_TRACKING_URI names one."""
    from draftlab.tracking.run_context import repo_root

    return (repo_root() / "mlruns").absolute()


def call_with_timeout(what: str, uri: str, call, timeout: float):
    """Runs `call()` in a daemon thread; a store that hangs (retries, locks) is refused after `timeout` s.
    A daemon thread never holds the process open after the error."""
    result: dict = {}

    def target():
        try:
            result["value"] = call()
        except BaseException as err:  # noqa: BLE001 - handed back to the caller below
            result["error"] = err

    worker = threading.Thread(target=target, name="draftlab-store-check", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise StoreError(f"tracking.uri: {what} {uri} gave no answer within {timeout:.0f} s; {HINT}")
    if "error" in result:
        err = result["error"]
        raise StoreError(f"tracking.uri: {what} {uri} failed: {type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''}; {HINT}") from err
    return result["value"]

