"""A TEST DOUBLE for a generation server: the tiny target behind SGLang's `/generate` or vLLM's `/v1/completions`
request and response shapes (see draftlab/serve/remote.py for where they come from). It is neither SGLang nor vLLM.

    python tests/standin_generate_server.py --api sglang|vllm [--fail-every N] [--delay-ms MS] [--port P]

Binds 127.0.0.1 (on a free port unless --port) and prints `PORT <n>` when ready; SGLang's launch flags are
accepted and ignored, so the launch builder can start it in place of `python -m sglang.launch_server`. Greedy
answers come from draftlab's own `generate_batch` on one prompt at a time, so they must equal the local (batched)
path token for token.
--fail-every N answers every Nth request with 503 (a transient error the client must retry).
"""

import argparse
import itertools
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "src")]

from standin_http import JsonHandler  # noqa: E402

import torch  # noqa: E402

from draftlab.stages.generate import generate_batch  # noqa: E402
from draftlab.target.target import tiny_target  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--api", choices=["sglang", "vllm"], required=True)
    p.add_argument("--fail-every", type=int, default=0)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)  # 0 = a free one, printed as PORT <n>
    p.add_argument("--model", default="tiny", help="the model path it says it serves")
    p.add_argument("--id-offset", type=int, default=0, help="added to every answered id (a model with more ids)")
    args, _ = p.parse_known_args()  # launched as `python -m sglang.launch_server ...`: other flags ignored
    torch.set_num_threads(1)
    target = tiny_target()
    lock = threading.Lock()  # one forward at a time; the HTTP layer stays concurrent
    counter = itertools.count(1)

    def generate(ids, max_new, temperature, stops, seed):
        assert set(stops) == set(target.eos_token_ids), stops
        with lock:
            torch.manual_seed(seed)
            answer = generate_batch(target, [ids], max_new, temperature)[0]
        time.sleep(args.delay_ms / 1000)
        return [t + args.id_offset for t in answer]

    class Handler(JsonHandler):
        def do_GET(self):
            if self.path == "/health":
                self.reply(200, {})
            elif args.api == "sglang" and self.path == "/model_info":
                self.reply(200, {"model_path": args.model, "is_generation": True})
            elif args.api == "vllm" and self.path == "/v1/models":
                self.reply(200, {"object": "list", "data": [{"id": args.model, "object": "model"}]})
            else:
                self.reply(404, {"detail": "Not Found"})

        def do_POST(self):
            body = self.json_body()
            if args.fail_every and next(counter) % args.fail_every == 0:
                self.reply(503, {"error": "stand-in: overloaded"})
                return
            if args.api == "sglang" and self.path == "/generate":
                sp = body["sampling_params"]
                ids = generate(body["input_ids"], sp["max_new_tokens"], sp["temperature"], sp["stop_token_ids"],
                               sp.get("sampling_seed", 0))
                finish = ({"type": "stop", "matched": ids[-1]} if ids and ids[-1] in sp["stop_token_ids"]
                          else {"type": "length", "length": len(ids)})
                self.reply(200, {"text": "", "output_ids": ids, "meta_info": {
                    "prompt_tokens": len(body["input_ids"]), "completion_tokens": len(ids), "finish_reason": finish}})
            elif args.api == "vllm" and self.path == "/v1/completions":
                if not isinstance(body.get("prompt"), list) or not body.get("return_token_ids"):
                    self.reply(400, {"error": "stand-in expects token-id prompts and return_token_ids"})
                    return
                ids = generate(body["prompt"], body["max_tokens"], body["temperature"], body["stop_token_ids"],
                               body.get("seed", 0))
                stopped = bool(ids) and ids[-1] in body["stop_token_ids"]
                self.reply(200, {"id": "cmpl-standin", "object": "text_completion", "model": "tiny", "choices": [{
                    "index": 0, "text": "", "token_ids": ids, "finish_reason": "stop" if stopped else "length",
                    "stop_reason": ids[-1] if stopped else None}]})
            else:
                self.reply(404, {"detail": "Not Found"})

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
