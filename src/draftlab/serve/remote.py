"""Generation through a serving engine (data.engine=server): token ids in, token ids out, nothing re-tokenized.

The chat template is applied here with the target's tokenizer; the server only continues the ids. Both request
shapes were read from the servers' source:
- SGLang (0.5.23) native `POST /generate`: `GenerateReqInput` in python/sglang/srt/managers/io_struct.py takes
  `input_ids` (list[int]) and `sampling_params` (python/sglang/srt/sampling/sampling_params.py: max_new_tokens,
  temperature, top_p, top_k, stop_token_ids, sampling_seed). The answer's `output_ids` (tokenizer_manager.py,
  `_handle_batch_output`) holds the generated ids, the matched stop token included; `meta_info.finish_reason`
  is {"type": "stop"|"length"|"abort", "matched": id}.
- vLLM `POST /v1/completions`: `CompletionRequest` in vllm/entrypoints/openai/completion/protocol.py (formerly
  vllm/entrypoints/openai/protocol.py) takes `prompt` as a list of token ids, max_tokens, temperature, seed,
  stop_token_ids, and `return_token_ids: true` adds `choices[i].token_ids` (the generated ids) to the response;
  `finish_reason` is "stop"|"length" and `stop_reason` the stop token id when one of stop_token_ids matched.

Requests run `data.server.concurrency` at a time; connection errors, timeouts, 429 and 5xx are retried with
exponential backoff (`data.server.retries`) once the server has answered; a server that never answered is
refused at its first failed connection, and anything else fails at once. Every error names the URL.
Sample i is seeded with data.seed * 1_000_003 + i, so sampled answers do not depend on request order.
"""

from __future__ import annotations

import json
import logging
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("draftlab.generate")
# No proxy, whatever http_proxy says: a server on a private network must not be routed through a proxy.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}
BACKOFF_S = 0.5  # first wait; doubles per attempt
PROBE_TIMEOUT_S = 3.0  # preflight's one connection attempt: a dead URL is refused within seconds


class ServerError(RuntimeError):
    """The generation server is unreachable, is not SGLang/vLLM, or refused a request; names the URL."""


class _Transient(Exception):
    pass


@dataclass
class TokenizerSide:
    """What generation needs of the target when an engine holds the weights: tokenizer, chat template, stops."""

    tokenizer: object
    name: str
    fingerprint: str
    eos_token_ids: list[int]
    vocab_size: int  # the model's (embedding rows): every answered token id must be below it

    def chat_ids(self, prompt: str) -> list[int]:
        from draftlab.target.target import Target

        return Target.chat_ids(self, prompt)  # the same template code as the local path


def tokenizer_side(target_cfg, cache_dir: Path) -> TokenizerSide:
    """The target without its weights (a 1T target is never loaded here); the tiny target is built in full."""
    from draftlab.target.target import config_fingerprint, serving_path, tiny_target

    if target_cfg.name == "tiny":
        t = tiny_target(target_cfg.tiny)
        return TokenizerSide(t.tokenizer, t.name, t.fingerprint, t.eos_token_ids, t.model.config.vocab_size)
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from draftlab.target.target import _prepare_tokenizer

    path = serving_path(target_cfg, cache_dir)
    kwargs = {"gguf_file": target_cfg.gguf_file} if target_cfg.gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    _prepare_tokenizer(tokenizer)
    config = AutoConfig.from_pretrained(path, **kwargs)
    try:
        eos = GenerationConfig.from_pretrained(path, **kwargs).eos_token_id
    except OSError:  # no generation_config.json
        eos = None
    if eos is None:
        eos = config.eos_token_id if config.eos_token_id is not None else tokenizer.eos_token_id
    name = "smollm2" if target_cfg.name == "smollm2" else target_cfg.path
    return TokenizerSide(tokenizer, name, config_fingerprint(name, config.to_dict()),
                         sorted({eos} if isinstance(eos, int) else set(eos)), int(config.vocab_size))


def probe(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """One connection attempt to the server, before any work: a URL where nothing listens raises ServerError."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
    except (OSError, ValueError) as err:
        reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
        raise ServerError(f"data.server.url: no server answers at {url} ({reason}); start it first, or fix the "
                          "URL") from None


def trim_answer(ids: list[int], eos: set[int]) -> list[int]:
    """The answer up to and including its first end-of-turn token, as the local path keeps it."""
    for i, token in enumerate(ids):
        if token in eos:
            return list(ids[: i + 1])
    return list(ids)


def sglang_body(ids: list[int], max_new_tokens: int, temperature: float, eos: list[int], seed: int) -> dict:
    params = {"max_new_tokens": int(max_new_tokens), "temperature": float(temperature), "top_p": 1.0, "top_k": -1,
              "stop_token_ids": list(eos), "skip_special_tokens": False}
    if temperature > 0:
        params["sampling_seed"] = int(seed)
    return {"input_ids": [int(t) for t in ids], "sampling_params": params}


def sglang_answer(response, eos: list[int]) -> list[int]:
    out = response[0] if isinstance(response, list) else response
    ids = list(out["output_ids"])
    finish = (out.get("meta_info") or {}).get("finish_reason") or {}
    if isinstance(finish, dict) and finish.get("type") == "abort":
        raise ServerError(f"request aborted: {finish.get('message')}")
    matched = finish.get("matched") if isinstance(finish, dict) else None
    if isinstance(matched, int) and matched in eos and matched not in ids:
        ids.append(matched)  # releases that trim the stop token still say which one ended the answer
    return trim_answer(ids, set(eos))


def vllm_body(ids: list[int], max_new_tokens: int, temperature: float, eos: list[int], seed: int,
              model: str | None) -> dict:
    body = {"prompt": [int(t) for t in ids], "max_tokens": int(max_new_tokens), "temperature": float(temperature),
            "top_p": 1.0, "stop_token_ids": list(eos), "return_token_ids": True, "skip_special_tokens": False,
            "seed": int(seed)}
    if model:
        body["model"] = model
    return body


def vllm_answer(response: dict, eos: list[int]) -> list[int]:
    choice = response["choices"][0]
    if choice.get("token_ids") is None:
        raise ServerError("the vLLM server returned no token_ids (it predates return_token_ids: vLLM >= 0.10.2)")
    ids = list(choice["token_ids"])
    stop = choice.get("stop_reason")
    if choice.get("finish_reason") == "stop" and isinstance(stop, int) and stop in eos and stop not in ids:
        ids.append(stop)
    return trim_answer(ids, set(eos))


class RemoteGenerator:
    """Answers tokenised prompts through a running SGLang or vLLM server (see the module doc)."""

    def __init__(self, url: str, eos: list[int], api: str = "auto", concurrency: int = 32, retries: int = 5,
                 timeout_s: float = 600.0, model: str | None = None, backoff_s: float = BACKOFF_S):
        self.url = url.rstrip("/")
        self.eos, self.concurrency, self.retries = list(eos), int(concurrency), int(retries)
        self.timeout_s, self.model, self.backoff_s = float(timeout_s), model, backoff_s
        self.served: str | None = None  # the model the server says it serves (found by detection)
        self.answered = False  # a server that never answered is not retried: its URL is wrong, or it is down
        self.api = self._detect() if api == "auto" else api

    # ------------------------------------------------------------------ HTTP
    def _call(self, path: str, body: dict | None, timeout_s: float) -> tuple[int, object]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method="GET" if body is None else "POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with OPENER.open(request, timeout=timeout_s) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else {}
        except urllib.error.HTTPError as err:
            raw = err.read().decode("utf-8", "replace")[:500]
            return err.code, {"error": raw}
        except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError) as err:
            raise _Transient(f"{type(err).__name__}: {getattr(err, 'reason', err)}") from None

    def _detect(self) -> str:
        """Fails fast (one try each, short timeout) on a dead URL or a server that is neither SGLang nor vLLM."""
        try:
            status, info = self._call("/model_info", None, 10.0)  # SGLang only
            self.answered = True
            if status == 200:
                self.served = info.get("model_path") if isinstance(info, dict) else None
                return "sglang"
            status, models = self._call("/v1/models", None, 10.0)
        except _Transient as err:
            raise ServerError(f"data.server.url: no server answers at {self.url} ({err})") from None
        if status == 200 and isinstance(models, dict) and "data" in models:
            first = models["data"][0] if models["data"] and isinstance(models["data"][0], dict) else {}
            self.served = first.get("root") or first.get("id")  # root: the path behind a --served-model-name
            return "vllm"
        raise ServerError(f"data.server.url: {self.url} is neither SGLang (/model_info) nor vLLM (/v1/models); "
                          f"/v1/models answered {status}")

    def _post(self, path: str, body: dict) -> object:
        for attempt in range(self.retries + 1):
            try:
                status, out = self._call(path, body, self.timeout_s)
                self.answered = True
                if status == 200:
                    return out
                if status not in TRANSIENT_STATUS:
                    raise ServerError(f"{self.url}{path} answered {status}: {out}")
                problem = f"status {status}"
            except _Transient as err:
                if not self.answered:
                    raise ServerError(f"data.server.url: no server answers at {self.url} ({err})") from None
                problem = str(err)
            if attempt < self.retries:
                wait = self.backoff_s * 2**attempt
                log.warning("generate: %s%s: %s; retrying in %.1f s", self.url, path, problem, wait)
                time.sleep(wait)
        raise ServerError(f"{self.url}{path}: still failing after {self.retries} retries ({problem})")

    # ------------------------------------------------------------------ generation
    def answer_one(self, ids: list[int], max_new_tokens: int, temperature: float, seed: int) -> list[int]:
        if self.api == "sglang":
            return sglang_answer(self._post("/generate", sglang_body(ids, max_new_tokens, temperature, self.eos, seed)),
                                 self.eos)
        body = vllm_body(ids, max_new_tokens, temperature, self.eos, seed, self.model)
        return vllm_answer(self._post("/v1/completions", body), self.eos)

    def answer(self, prompts: list[list[int]], first: int, data) -> list[list[int]]:
        """Answers prompt k (sample first + k) for every k, in order, `concurrency` requests in flight."""
        def one(k: int) -> list[int]:
            seed = data.seed * 1_000_003 + first + k
            return self.answer_one(prompts[k], data.max_new_tokens, data.temperature, seed)

        with ThreadPoolExecutor(max_workers=min(self.concurrency, max(1, len(prompts)))) as pool:
            return list(pool.map(one, range(len(prompts))))


def warn_if_not_the_target(served: str | None, target: str, url: str) -> None:
    """A server serves the target when one name contains the other (its model path's last part against the
    target's, case aside): `/models/Llama-3.1-8B-Instruct` serves `meta-llama/Llama-3.1-8B-Instruct`. A warning,
    not an error: a server started with another name can still serve the same weights."""
    if not served:
        return
    have, want = Path(str(served)).name.lower(), Path(str(target)).name.lower()
    if have and want and have not in want and want not in have:
        log.warning("generate: %s serves %r, but the target is %r: the answers must come from the model whose "
                    "hidden states extract reads (check data.server.url and target.path)", url, served, target)


class ServerEngine:
    """data.engine=server for the generate stage: a client, plus the SGLang server it started when no URL was
    given (launched with the existing launch builder and start-up monitor; stopped by close())."""

    def __init__(self, cfg, out: Path):
        from draftlab.target.target import serving_path

        server_cfg = cfg.data.server
        self.target = tokenizer_side(cfg.target, Path(cfg.paths.root) / "models")
        self.server = None
        url = server_cfg.url
        if not url:
            from draftlab.sglang.launch import build_baseline_argv
            from draftlab.sglang.monitor import SGLangServer, free_port

            host = cfg.serve.host
            port = free_port(host)
            argv = build_baseline_argv(cfg.serve, serving_path(cfg.target, Path(cfg.paths.root) / "models"), port)
            self.server = SGLangServer(argv, Path(out) / "sglang-generate.log", host, port,
                                       cfg.serve.startup_timeout_s, name="sglang-generate",
                                       metric_prefix="generate/startup")
            self.server.__enter__()
            url = self.server.url
        try:
            self.client = RemoteGenerator(url, self.target.eos_token_ids, server_cfg.api, server_cfg.concurrency,
                                          server_cfg.retries, server_cfg.timeout_s, server_cfg.model)
        except BaseException:
            self.close()
            raise
        log.info("generate: answering through %s (%s, %d in flight)", url, self.client.api, server_cfg.concurrency)
        if self.server is None:  # a server someone else started: is it serving the target?
            warn_if_not_the_target(self.client.served, cfg.target.path or self.target.name, url)

    def answer(self, prompts: list[list[int]], first: int, data) -> list[list[int]]:
        answers = self.client.answer(prompts, first, data)
        for k, ids in enumerate(answers):  # a bigger model's ids would index past the features' vocabulary
            bad = [t for t in ids if not 0 <= t < self.target.vocab_size]
            if bad:
                raise ServerError(f"data.server.url: {self.client.url} answered token id {bad[0]} for sample "
                                  f"{first + k}, outside the vocabulary of target {self.target.name} "
                                  f"({self.target.vocab_size}): it does not serve the target")
        return answers

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
