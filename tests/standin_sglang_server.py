"""A TEST DOUBLE for `python -m sglang.launch_server`: prints SGLang 0.5.23-like start-up log lines and serves
/health, /model_info, /server_info and /generate on 127.0.0.1 with made-up numbers. It is not SGLang.

Accepts SGLang's flags (ignores the ones it does not need) plus stand-in flags:
  --standin-phase-s S     seconds spent in each start-up phase (default 0.05)
  --standin-crash-at P    exit with status 3 when phase P begins (target_weights, draft_weights, ...)
  --standin-never-ready   bind the port but answer /health with 503 forever
  --standin-ignore-sigterm  survive SIGTERM (tests the SIGKILL escalation)
  --standin-child-pidfile F  fork a child in the same process group and write its pid to F
  --standin-accept-length T  tokens per verify step reported in meta_info (default 3.0)
  --standin-step-ms MS    simulated time of one forward step (default 1.0)
  --standin-draft-ms MS   simulated time of one draft step, added per speculative step (default 0.0)
"""

import argparse
import math
import os
import signal
import sys
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script, also through runpy

from standin_http import JsonHandler  # noqa: E402


def say(message: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"[{stamp}] {message}", flush=True)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--speculative-algorithm")
    p.add_argument("--speculative-draft-model-path")
    p.add_argument("--speculative-num-steps", type=int)
    p.add_argument("--speculative-eagle-topk", type=int)
    p.add_argument("--speculative-num-draft-tokens", type=int)
    p.add_argument("--standin-phase-s", type=float, default=0.05)
    p.add_argument("--standin-crash-at")
    p.add_argument("--standin-never-ready", action="store_true")
    p.add_argument("--standin-ignore-sigterm", action="store_true")
    p.add_argument("--standin-child-pidfile")
    p.add_argument("--standin-accept-length", type=float, default=3.0)
    p.add_argument("--standin-step-ms", type=float, default=1.0)
    p.add_argument("--standin-draft-ms", type=float, default=0.0)
    args, _unknown = p.parse_known_args()
    return args


def phase(args, name: str, begin: str, end: str | None = None) -> None:
    if args.standin_crash_at == name:
        say(f"Scheduler hit an exception: RuntimeError: stand-in crash in {name}")
        sys.exit(3)
    say(begin)
    time.sleep(args.standin_phase_s)
    if end:
        say(end)


def start_up(args) -> None:
    spec = bool(args.speculative_algorithm)
    say(f"server_args=ServerArgs(model_path='{args.model_path}', speculative_algorithm={args.speculative_algorithm!r})")
    phase(args, "target_weights", "Load weight begin. avail mem=70.00 GB",
          "Load weight end. elapsed=1.00 s, type=LlamaForCausalLM, avail mem=60.00 GB, mem usage=10.00 GB.")
    phase(args, "memory_pool", "KV Cache is allocated. #tokens: 100000", "Memory pool end. avail mem=20.00 GB")
    if spec:
        phase(args, "draft_weights", "Load weight begin. avail mem=20.00 GB",
              "Load weight end. elapsed=0.10 s, type=LlamaForCausalLMEagle3, avail mem=19.00 GB, mem usage=1.00 GB.")
    name = "target verify" if spec else "target decode"
    phase(args, "cuda_graph_target", f"Capture {name} CUDA graph begin. backend=full, avail mem=19.00 GB",
          f"Capture {name} CUDA graph end. bs=[1, 2, 4], elapsed=0.05 s, mem usage=0.50 GB.")
    if spec:
        phase(args, "cuda_graph_draft", "Capture draft decode CUDA graph begin. backend=full, num_tokens_per_req=1",
              "Capture draft decode CUDA graph end. elapsed=0.05 s")
    say("max_total_num_tokens=100000, chunked_prefill_size=8192, max_running_requests=48, context_len=2048")


class State:
    ready = False
    verify_ct = 0
    tokens = 0


def make_handler(args):
    class Handler(JsonHandler):
        def do_GET(self):
            if self.path in ("/health", "/health_generate", "/ready"):
                self.reply(200 if State.ready else 503)
            elif self.path == "/model_info":
                self.reply(200, {"model_path": args.model_path, "is_generation": True})
            elif self.path == "/server_info":
                info = {"speculative_algorithm": args.speculative_algorithm,
                        "speculative_num_steps": args.speculative_num_steps,
                        "speculative_eagle_topk": args.speculative_eagle_topk,
                        "speculative_num_draft_tokens": args.speculative_num_draft_tokens,
                        "version": "0.5.23-standin", "internal_states": [{}]}
                if args.speculative_algorithm and State.verify_ct:
                    info["internal_states"][0]["avg_spec_accept_length"] = State.tokens / State.verify_ct
                self.reply(200, info)
            else:
                self.reply(404, {"error": "not found"})

        def do_POST(self):
            body = self.json_body()
            if self.path == "/flush_cache":  # like SGLang: resets the acceptance counters, answers in plain text
                State.verify_ct = State.tokens = 0
                self.reply(200, "Cache flushed.\nPlease check backend logs for more details.\n", "text/plain")
                return
            if self.path != "/generate":
                self.reply(404, {"error": "not found"})
                return
            n = int(body.get("sampling_params", {}).get("max_new_tokens", 16))
            prompt = body.get("input_ids") or [ord(c) % 50 for c in body.get("text", "")]
            meta = {"prompt_tokens": len(prompt), "completion_tokens": n, "e2e_latency": 0.0}
            steps = n
            if args.speculative_algorithm:
                steps = math.ceil(n / args.standin_accept_length)
                correct, extra = divmod(n - steps, steps)  # each step commits its correct drafts + a bonus
                hist = [0] * (correct + 2)
                hist[correct], hist[correct + 1] = steps - extra, extra
                meta.update(spec_verify_ct=steps, spec_accept_length=n / steps, spec_correct_drafts_histogram=hist)
                State.verify_ct += steps
                State.tokens += n
            draft_ms = args.standin_draft_ms * (args.speculative_num_steps or 0)
            time.sleep(steps * (args.standin_step_ms + draft_ms) / 1000)
            self.reply(200, {"text": "x" * n, "output_ids": list(range(n)), "meta_info": meta})

    return Handler


def main() -> None:
    args = parse()
    if args.standin_ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.standin_child_pidfile:
        child = os.fork()
        if child == 0:  # a "scheduler" child that would outlive a careless kill of the leader only
            signal.signal(signal.SIGTERM, signal.SIG_IGN) if args.standin_ignore_sigterm else None
            while True:
                time.sleep(1)
        with open(args.standin_child_pidfile, "w") as handle:
            handle.write(str(child))
    start_up(args)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(args))
    say(f"Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)")
    import threading

    threading.Thread(target=server.serve_forever, daemon=True).start()
    if args.standin_crash_at == "warmup":
        time.sleep(args.standin_phase_s)
        say("Initialization failed. warmup error: stand-in")
        os._exit(4)
    time.sleep(args.standin_phase_s)  # warm-up: /health answers 503
    if not args.standin_never_ready:
        State.ready = True
        say("The server is fired up and ready to roll!")
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
