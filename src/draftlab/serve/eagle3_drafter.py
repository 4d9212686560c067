"""The EAGLE-3 draft behind the engine's `Drafter` protocol, with SGLang's chain semantics (topk = 1).

Alignment (docs/ARCHITECTURE.md "Draft alignment"): the draft's input at rope position t is
(target feature f_t, embed(x_{t+1})) and its output predicts x_{t+2}. So after a verification the draft
"extends" over the committed tokens with the target features of the positions just before them (one forward,
writing real KV entries), then drafts with its own hidden state: step j runs at position t+j on
(draft hidden of step j-1, embed(d_j)). Drafted KV entries are cropped at the end of `propose`, so only
extended (target-feature) entries survive a cycle, as in SGLang where the draft-extend pass rewrites them.

k draft tokens cost the extend forward (done in `commit`) plus k-1 draft forwards, like SGLang's
`speculative_num_steps`. Tokens stay on the device: no host sync inside a cycle.
"""

from __future__ import annotations

import torch

from draftlab.model.draft import Eagle3Draft, KVCache


def pick_draft_token(logits: torch.Tensor, temperature: float, generator: torch.Generator | None,
                     target_ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One draft token ([1], a target id) from draft-vocabulary logits: the argmax when greedy, else a sample
    with its probabilities q over the target vocabulary (tokens outside the draft vocab get 0), which the
    verifier's rejection sampling needs."""
    if temperature <= 0:
        return target_ids[logits.argmax(-1, keepdim=True)], None
    q_draft = torch.softmax(logits.float() / temperature, -1)
    draft_id = torch.multinomial(q_draft, 1, generator=generator)
    q = torch.zeros(vocab_size, device=logits.device).scatter_add(0, target_ids, q_draft)
    return target_ids[draft_id], q


def draft_chain(k: int, logits: torch.Tensor, hidden: torch.Tensor, step, temperature: float,
                generator: torch.Generator | None, target_ids: torch.Tensor, vocab_size: int
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """k draft tokens (target ids) from the draft's state (logits, hidden), and their q when sampling.
    `step(j, token, hidden) -> (logits, hidden)` runs draft step j+1 on the token just drafted; the dynamic and
    the static drafter differ only in it."""
    tokens, qs = [], []
    for j in range(k):
        token, q = pick_draft_token(logits, temperature, generator, target_ids, vocab_size)
        tokens.append(token)
        if q is not None:
            qs.append(q)
        if j < k - 1:
            logits, hidden = step(j, token, hidden)
    return torch.cat(tokens), (torch.stack(qs) if qs else None)


class Eagle3Drafter:
    def __init__(self, model: Eagle3Draft, feature_layers: tuple[int, ...]):
        self.model = model.eval()
        self.feature_layers = tuple(feature_layers)
        self.device = next(model.parameters()).device
        vocab = torch.arange(model.cfg.draft_vocab_size, device=self.device)
        self.target_ids = model.draft_to_target(vocab)  # draft id -> target id (identity without d2t)
        self.vocab_size = model.cfg.vocab_size
        self.cache: KVCache | None = None
        self.length = 0  # extended positions 0..length-1 hold real (target-feature) KV entries
        self.logits = self.hidden = None  # the draft's output at the last extended position

    @classmethod
    def from_folder(cls, folder, target_model, rules: str = "current", dtype: torch.dtype | None = None):
        """(drafter, LoadedDraft) for an exported draft folder, loaded as SGLang would load it."""
        from draftlab.serve.loader import load_draft_like_sglang

        loaded = load_draft_like_sglang(folder, target_model, rules, dtype)
        return cls(loaded.model, loaded.feature_layers), loaded

    def start(self, prompt_ids: torch.Tensor, first_token: int, features: torch.Tensor) -> None:
        self.cache = KVCache(self.model.cfg.num_hidden_layers)
        self.length = 0
        first = torch.tensor([first_token], dtype=torch.long, device=prompt_ids.device)
        # position t pairs feature f_t with token t+1: the prompt shifted by one, then the first token
        self._extend(torch.cat([prompt_ids[1:], first]), features)

    def commit(self, tokens: torch.Tensor, features: torch.Tensor) -> None:
        self._extend(tokens.to(self.device), features)

    @torch.inference_mode()
    def _extend(self, ids: torch.Tensor, features: torch.Tensor) -> None:
        n = ids.numel()
        if features.shape[0] != n:
            raise ValueError(f"extend: {n} tokens but {features.shape[0]} feature rows")
        positions = torch.arange(self.length, self.length + n, device=self.device)[None]
        logits, hidden = self.model(ids[None], features[None], positions, self.cache)
        self.length += n
        self.logits, self.hidden = logits[0, -1], hidden[:, -1:]

    @torch.inference_mode()
    def propose(self, k: int, temperature: float, generator: torch.Generator | None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        def step(j: int, token: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            # step j+1 at rope position (last extended position) + j + 1, on the draft's own hidden state
            position = torch.full((1, 1), self.length + j, dtype=torch.long, device=self.device)
            out, hidden = self.model(token.view(1, 1), hidden, position, self.cache)
            return out[0, -1], hidden

        proposal = draft_chain(k, self.logits, self.hidden, step, temperature, generator, self.target_ids,
                               self.vocab_size)
        self.cache.crop(self.length)  # drafted entries go; the next extend writes the real ones
        return proposal
