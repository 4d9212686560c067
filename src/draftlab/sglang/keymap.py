"""How SGLang's `LlamaForCausalLMEagle3.load_weights` maps checkpoint keys onto its parameters, as data.

SGLang never complains about a key it cannot place and never checks that every parameter was written: a
draft whose decoder weights are all dropped still boots and serves at accept length ~1. This module replays
the loader's name rules on key names and shapes (no torch needed) so check-draft and the local engine can
see exactly what SGLang would load. Two rule sets, checked against SGLang's llama_eagle3.py:

- `current` (0.5.23): parameters `model.layers.{i}.*`; before anything else the substrings `midlayer` ->
  `layers.0` and `aux_norm_{low,mid,high}` -> `fc_norm.{0,1,2}` are renamed; fc width = target hidden x
  num_aux (num_aux_hidden_states, else len(eagle_config ids), else 3). Every layer has qkv (2H input on
  layer 0, H after), o, gate_up, down, input_layernorm, post_attention_layernorm and hidden_norm; layers >= 1
  normalise with hidden_norm, so their input_layernorm exists but is never used by the forward pass.
- `legacy` (the SGLang that only knew `midlayer.*`): parameters `model.midlayer.*` for layer 0 and
  `model.additional_layers.{i-1}.*` (no input_layernorm) for the others, fc width always 3 x target hidden,
  no renames, no fc_norm / input_norm.

Both: a name containing `d2t` becomes hot_token_id = d2t + arange and is not a parameter; `t2d` is ignored;
`.q/.k/.v_proj` load as shards of `.qkv_proj`, `.gate/.up_proj` of `.gate_up_proj`; the parameter is the
name itself if it exists, else "model." + name; otherwise the key is dropped without a word.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from draftlab.sglang.st_files import read_headers, load_tensors

RULES = ("current", "legacy")
_STACKED = ((".q_proj", ".qkv_proj", "q"), (".k_proj", ".qkv_proj", "k"), (".v_proj", ".qkv_proj", "v"),
            (".gate_proj", ".gate_up_proj", 0), (".up_proj", ".gate_up_proj", 1))
_LEGACY_RENAMES = (("midlayer", "layers.0"), ("aux_norm_low", "fc_norm.0"), ("aux_norm_mid", "fc_norm.1"),
                   ("aux_norm_high", "fc_norm.2"))
EMBED = "model.embed_tokens.weight"


@dataclass
class Arch:
    """The sizes SGLang derives from a draft config.json (attribute-access semantics, defaults as in SGLang)."""

    hidden: int
    hidden_in: int  # target_hidden_size when the key exists, else hidden
    num_aux: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    draft_vocab: int | None  # None: head shared from the target (load_lm_head_from_target)
    tied: bool
    bias: bool
    fc_norm: bool
    input_norm: bool


def arch_from_config(config: dict, rules: str = "current") -> Arch:
    _check_rules(rules)
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    # SGLang tests `hasattr(config, "target_hidden_size")`; a null value would crash it, check-draft says so.
    hidden_in = config["target_hidden_size"] if "target_hidden_size" in config else hidden
    hidden_in = int(hidden_in) if hidden_in is not None else hidden
    eagle = config.get("eagle_config") or {}
    if rules == "legacy":
        num_aux = 3
    elif config.get("num_aux_hidden_states") is not None:
        num_aux = int(config["num_aux_hidden_states"])
    else:
        ids = eagle.get("eagle_aux_hidden_state_layer_ids")
        num_aux = len(ids) if ids else 3
    current = rules == "current"
    return Arch(
        hidden=hidden, hidden_in=hidden_in, num_aux=num_aux, layers=int(config.get("num_hidden_layers", 1)),
        heads=heads, kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads), intermediate=int(config["intermediate_size"]),
        vocab=int(config["vocab_size"]), draft_vocab=config.get("draft_vocab_size"),
        tied=bool(config.get("tie_word_embeddings", False)), bias=bool(config.get("bias", False)),
        fc_norm=current and bool(config.get("fc_norm") or config.get("use_aux_norm")),
        # the eagle_config value wins even when false (llama_eagle3.py: eagle_config.get(key, top-level))
        input_norm=current and bool(eagle.get("norm_before_fc", config.get("norm_before_fc", False))),
    )


@dataclass
class ParamSpec:
    shapes: dict[str, tuple[int, ...]]  # SGLang parameter name -> full shape
    shards: dict[str, dict]  # fused parameter -> {shard id: shape of that shard in a checkpoint}
    unused: set[str]  # parameters that exist but the forward pass never reads
    shared: set[str]  # parameters SGLang overwrites from the target after loading


def param_spec(config: dict, rules: str = "current") -> ParamSpec:
    a = arch_from_config(config, rules)
    H, hd = a.hidden, a.head_dim
    shapes: dict[str, tuple[int, ...]] = {EMBED: (a.vocab, H), "model.fc.weight": (H, a.hidden_in * a.num_aux)}
    shards: dict[str, dict] = {}
    unused: set[str] = set()
    if a.bias:
        shapes["model.fc.bias"] = (H,)
    if a.input_norm:
        shapes["model.input_norm.weight"] = (a.hidden_in * a.num_aux,)
    if a.fc_norm:
        for j in range(a.num_aux):
            shapes[f"model.fc_norm.{j}.weight"] = (a.hidden_in,)
    for i in range(a.layers):
        if rules == "current":
            prefix = f"model.layers.{i}."
        else:
            prefix = "model.midlayer." if i == 0 else f"model.additional_layers.{i - 1}."
        width = 2 * H if i == 0 else H
        qkv, gate_up = prefix + "self_attn.qkv_proj.weight", prefix + "mlp.gate_up_proj.weight"
        shapes[qkv] = ((a.heads + 2 * a.kv_heads) * hd, width)
        shards[qkv] = {"q": (a.heads * hd, width), "k": (a.kv_heads * hd, width), "v": (a.kv_heads * hd, width)}
        shapes[prefix + "self_attn.o_proj.weight"] = (H, a.heads * hd)
        shapes[gate_up] = (2 * a.intermediate, H)
        shards[gate_up] = {0: (a.intermediate, H), 1: (a.intermediate, H)}
        shapes[prefix + "mlp.down_proj.weight"] = (H, a.intermediate)
        norms = ["post_attention_layernorm", "hidden_norm"]
        if rules == "current" or i == 0:  # legacy extra layers set input_layernorm = None
            norms.append("input_layernorm")
        for norm in norms:
            shapes[f"{prefix}{norm}.weight"] = (H,)
        if rules == "current" and i > 0:
            unused.add(prefix + "input_layernorm.weight")
    shapes["model.norm.weight"] = (H,)
    if not a.tied:  # tied: lm_head *is* embed_tokens and named_parameters() lists it once
        shapes["lm_head.weight"] = (a.draft_vocab if a.draft_vocab is not None else a.vocab, H)
    shared = set()
    # set_embed only replaces the embedding when target_hidden_size == hidden_size (llama.py)
    if a.hidden_in == H:
        shared.add(EMBED)
    if a.draft_vocab is None and not a.tied:
        shared.add("lm_head.weight")
    return ParamSpec(shapes, shards, unused, shared)


def expected_params(config: dict, rules: str = "current") -> dict[str, tuple[int, ...]]:
    """SGLang parameter names -> shapes that `LlamaForCausalLMEagle3` has for this draft config."""
    return dict(param_spec(config, rules).shapes)


@dataclass
class Landing:
    key: str
    param: str
    shard: object  # None for a whole parameter, else "q"/"k"/"v"/0/1
    shape: tuple[int, ...]
    expected: tuple[int, ...]

    @property
    def shape_ok(self) -> bool:
        return tuple(self.shape) == tuple(self.expected)


@dataclass
class KeyReport:
    rules: str
    landed: dict[str, Landing] = field(default_factory=dict)  # key -> where it loads (shape ok or not)
    dropped: dict[str, tuple[int, ...]] = field(default_factory=dict)  # silently skipped keys -> shape
    looked_up: dict[str, str] = field(default_factory=dict)  # dropped key -> the name SGLang looked for
    ignored: list[str] = field(default_factory=list)  # t2d: skipped by design
    never_loaded: dict[str, tuple[int, ...]] = field(default_factory=dict)  # param (or "param[shard]") -> shape
    unused_loaded: dict[str, str] = field(default_factory=dict)  # key -> unused param it lands in
    shared_from_target: list[str] = field(default_factory=list)  # params overwritten from the target
    d2t_key: str | None = None
    d2t_shape: tuple[int, ...] | None = None

    @property
    def has_d2t(self) -> bool:
        return self.d2t_key is not None

    @property
    def mismatches(self) -> list[Landing]:
        return [land for land in self.landed.values() if not land.shape_ok]

    @property
    def ok(self) -> bool:
        return not (self.dropped or self.never_loaded or self.mismatches)

    def lines(self) -> list[str]:
        """One human-readable line per problem, each naming the key or parameter."""
        out = [f"dropped silently: {k} {list(s)} (SGLang has neither '{self.looked_up[k]}' nor "
               f"'model.{self.looked_up[k]}')" for k, s in self.dropped.items()]
        out += [f"shape mismatch: {m.key} {list(m.shape)} -> {m.param}"
                f"{'' if m.shard is None else f'[{m.shard}]'} expects {list(m.expected)} (AssertionError at load)"
                for m in self.mismatches]
        out += [f"never loaded: {p} {list(s)} keeps its uninitialised values" for p, s in self.never_loaded.items()]
        return out


def _check_rules(rules: str) -> None:
    if rules not in RULES:
        raise ValueError(f"rules: {rules!r} is not one of {', '.join(RULES)}")


def route(key: str, spec: ParamSpec, rules: str) -> tuple[str, str | None, object]:
    """(kind, name, shard) for one checkpoint key, as load_weights routes it.

    kind is 'param' (name = the SGLang parameter), 'd2t', 't2d' or 'drop' (name = what SGLang looked for).
    """
    name = key
    if rules == "current":
        for old, new in _LEGACY_RENAMES:
            if old in name:
                name = name.replace(old, new)
    if "d2t" in name:
        return "d2t", None, None
    if "t2d" in name:
        return "t2d", None, None
    params = spec.shapes
    for old, new, shard in _STACKED:
        if old in name:
            name = name.replace(old, new)
            param = name if name in params else f"model.{name}"
            return ("param", param, shard) if param in params else ("drop", name, None)
    param = name if name in params else f"model.{name}"
    return ("param", param, None) if param in params else ("drop", name, None)


def map_keys(keys_with_shapes: dict[str, tuple], config: dict, rules: str = "current") -> KeyReport:
    """Replays SGLang's key mapping over checkpoint key names and shapes."""
    _check_rules(rules)
    spec = param_spec(config, rules)
    report = KeyReport(rules=rules, shared_from_target=sorted(spec.shared))
    written: dict[str, set] = {}
    for key, shape in keys_with_shapes.items():
        shape = tuple(shape)
        kind, param, shard = route(key, spec, rules)
        if kind == "d2t":
            report.d2t_key, report.d2t_shape = key, shape
        elif kind == "t2d":
            report.ignored.append(key)
        elif kind == "drop":
            report.dropped[key] = shape
            report.looked_up[key] = param
        else:
            expected = spec.shapes[param] if shard is None else spec.shards.get(param, {}).get(shard)
            if expected is None:  # a shard name on an unfused parameter: its loader would fail
                expected = spec.shapes[param]
            report.landed[key] = Landing(key, param, shard, shape, expected)
            if report.landed[key].shape_ok:
                written.setdefault(param, set()).add(shard)
            if param in spec.unused:
                report.unused_loaded[key] = param
    for param, shape in spec.shapes.items():
        if param in spec.shared or param in spec.unused:
            continue
        got = written.get(param, set())
        if None in got:
            continue
        if not got:
            report.never_loaded[param] = shape
        elif param in spec.shards:
            for shard, shard_shape in spec.shards[param].items():
                if shard not in got:
                    report.never_loaded[f"{param}[{shard}]"] = shard_shape
    return report


def ours_name(param: str, shard: object) -> str:
    """SGLang parameter (+ shard) -> our export's key naming (`layers.{i}.self_attn.q_proj.weight`, ...)."""
    name = param[len("model."):] if param.startswith("model.") else param
    if name.startswith("midlayer."):
        name = "layers.0." + name[len("midlayer."):]
    elif name.startswith("additional_layers."):
        index, rest = name[len("additional_layers."):].split(".", 1)
        name = f"layers.{int(index) + 1}.{rest}"
    if shard is not None:
        fused = ".qkv_proj" if ".qkv_proj" in name else ".gate_up_proj"
        part = {"q": ".q_proj", "k": ".k_proj", "v": ".v_proj", 0: ".gate_proj", 1: ".up_proj"}[shard]
        name = name.replace(fused, part)
    return name


def _split_fused(name: str, tensor, arch: Arch) -> dict:
    """A checkpoint that already holds fused qkv / gate_up: split it back into our per-projection keys."""
    if ".qkv_proj" in name:
        q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
        parts = tensor.split([q, kv, kv], dim=0)
        return {name.replace(".qkv_proj", p): t for p, t in zip((".q_proj", ".k_proj", ".v_proj"), parts)}
    if ".gate_up_proj" in name:
        gate, up = tensor.split([arch.intermediate, arch.intermediate], dim=0)
        return {name.replace(".gate_up_proj", ".gate_proj"): gate, name.replace(".gate_up_proj", ".up_proj"): up}
    return {name: tensor}


def load_like_sglang(folder: Path, rules: str = "current",
                     later_layer_norm: str = "hidden_norm") -> tuple[dict, KeyReport]:
    """The draft's tensors as SGLang would end up with them, in OUR export naming, plus the KeyReport.

    Dropped keys, shape-mismatched keys (SGLang would crash; we leave them out) and never-loaded parameters
    are absent from the state dict; the caller sees the silent failure by building the draft from it.
    `d2t` is kept (SGLang turns it into hot_token_id); SGLang never reads `t2d`, so it is rebuilt from d2t
    when d2t is present (it carries the same mapping) and absent otherwise.

    Layers >= 1 (current rules): SGLang normalises their input with `hidden_norm` and never reads their
    `input_layernorm`. Our draft calls that norm `later_layer_norm`, so `layers.{i}.<later_layer_norm>` is
    whatever SGLang loaded into `model.layers.{i}.hidden_norm` (absent when nothing was), and a checkpoint's
    `layers.{i}.input_layernorm` is left out because SGLang's forward ignores it.
    """
    import json

    import torch

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    headers = read_headers(folder)
    report = map_keys({k: v["shape"] for k, v in headers.items()}, config, rules)
    keep = [k for k, land in report.landed.items() if land.shape_ok]
    if report.d2t_key:
        keep.append(report.d2t_key)
    tensors = load_tensors(folder, keep)
    arch = arch_from_config(config, rules)
    spec = param_spec(config, rules)
    state: dict = {}
    for key in keep:
        if key == report.d2t_key:
            d2t = tensors[key].to(torch.int64)
            state["d2t"] = d2t
            t2d = torch.zeros(arch.vocab, dtype=torch.bool)
            targets = d2t + torch.arange(d2t.numel())
            t2d[targets[(targets >= 0) & (targets < arch.vocab)]] = True
            state["t2d"] = t2d
            continue
        land = report.landed[key]
        if land.param in spec.unused:
            continue
        name = ours_name(land.param, land.shard)
        if rules == "current" and _later_layer(name) and name.endswith(".hidden_norm.weight"):
            name = name.replace(".hidden_norm.", f".{later_layer_norm}.")
        state.update(_split_fused(name, tensors[key], arch))
    return state, report


def _later_layer(name: str) -> bool:
    parts = name.split(".")
    return len(parts) > 2 and parts[0] == "layers" and parts[1].isdigit() and int(parts[1]) > 0
