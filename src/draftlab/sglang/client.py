"""A minimal HTTP client for a local SGLang server (urllib only; loopback addresses only).

The benchmark talks only to a server it started itself on this machine, so any other host is refused: a
typo in serve.host must not send held-out prompts across the network.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

LOOPBACK = ("127.0.0.1", "localhost", "::1")
# No proxy, whatever http_proxy says: loopback traffic must never be routed through a proxy.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class SGLangClientError(RuntimeError):
    pass


def _body(raw: bytes) -> dict:
    """A JSON answer as it is; a plain-text one (SGLang's /flush_cache says "Cache flushed.") under "text"."""
    try:
        return json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {"text": raw.decode("utf-8", "replace")}


class SGLangClient:
    def __init__(self, host: str, port: int, timeout_s: float = 600.0):
        if host not in LOOPBACK:
            raise SGLangClientError(f"serve.host: {host!r} is not a loopback address; the benchmark only talks to "
                                    "a server it started on this machine")
        self.base = f"http://{'[::1]' if host == '::1' else host}:{int(port)}"
        self.timeout_s = timeout_s

    def _request(self, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method="GET" if body is None else "POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with OPENER.open(request, timeout=self.timeout_s) as resp:
                return resp.status, _body(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, _body(err.read())

    def generate(self, prompt: list[int] | str, max_new_tokens: int, temperature: float = 0.0) -> dict:
        """One /generate request; returns the response with `meta_info` and the client-side `latency_s`."""
        body: dict = {"sampling_params": {"max_new_tokens": int(max_new_tokens), "temperature": float(temperature)}}
        if isinstance(prompt, str):
            body["text"] = prompt
        else:
            body["input_ids"] = [int(t) for t in prompt]
        t0 = time.perf_counter()
        status, out = self._request("/generate", body)
        latency = time.perf_counter() - t0
        if status != 200:
            raise SGLangClientError(f"/generate answered {status}: {out}")
        if isinstance(out, list):  # a batch answer; we send one prompt at a time
            out = out[0]
        out["latency_s"] = latency
        return out

    def server_info(self) -> dict:
        status, out = self._request("/server_info")
        if status == 404:  # releases before the rename
            status, out = self._request("/get_server_info")
        if status != 200:
            raise SGLangClientError(f"/server_info answered {status}: {out}")
        return out

    def flush_cache(self) -> bool:
        """Resets the server's acceptance counters (only when idle); False when the server has no such endpoint."""
        status, _ = self._request("/flush_cache", {})
        return status == 200

    def health(self) -> int | None:
        try:
            status, _ = self._request("/health")
            return status
        except (urllib.error.URLError, OSError):
            return None


def server_accept_length(info: dict) -> float | None:
    """internal_states[0].avg_spec_accept_length, absent until the first decode-log interval has passed."""
    states = info.get("internal_states") or [{}]
    value = states[0].get("avg_spec_accept_length") if isinstance(states[0], dict) else None
    return float(value) if value is not None else None
