"""Converting a draft folder between SGLang format and vLLM speculators format; tensors are copied bit-exact.

The two formats hold the same tensors (speculators names `layers.{i}.*`, which SGLang 0.5.23 loads too; a
`midlayer.*` source is renamed to `layers.0.*`) and differ in config.json:

- SGLang: a flat Llama config with architectures ["LlamaForCausalLMEagle3"], draft_vocab_size,
  target_hidden_size and eagle_config.eagle_aux_hidden_state_layer_ids.
- speculators: architectures ["Eagle3Speculator"], speculators_config (algorithm, proposal methods,
  verifier), the Llama layer config nested in transformer_layer_config, top-level draft_vocab_size,
  target_hidden_size and eagle_aux_hidden_state_layer_ids, plus norm flags.

Layer ids: vLLM reads a speculators id j as "input of layer j", i.e. the capture point j (HF hidden_states[j]),
for every architecture. SGLang maps its ids to capture points by the target class's own rule (sglang/capture.py):
+1 for Llama and Qwen, +1 only when the first id is 1 for DeepSeek-V2/V3. So speculators ids = the capture points
the draft was trained on, read from its training record (draft_provenance.py), and back to the record's SGLang
ids. A draft without a record gets the Llama rule (+1 and -1). Keeping the integers, or adding 1 for a DeepSeek
draft whose first id is not 1, would silently shift every feature by one layer in one of the two engines.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

from draftlab.sglang import draft_provenance
from draftlab.util.fsutil import atomic_save_safetensors, atomic_write_json, check_destination, owned_folder
from draftlab.sglang.check import ARCH, is_speculators_config
from draftlab.sglang.st_files import load_tensors, read_headers

log = logging.getLogger("draftlab.convert")
LLAMA_RULE = ("the Llama rule (speculators id = SGLang id + 1), which shifts a DeepSeek-family draft whose first id "
              "is not 1 by one layer")
SPECULATORS_VERSION = "0.9.0"  # the speculators release whose schema this writes (shared/reference §3.1)
# Keys that are EAGLE-3 specific and live at the top level of a speculators config, not in the layer config.
_TOP_LEVEL = ("architectures", "draft_vocab_size", "target_hidden_size", "eagle_config", "num_aux_hidden_states",
              "eagle_aux_hidden_state_layer_ids", "norm_before_fc", "fc_norm", "norm_output", "use_aux_norm")
_NORM_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")


class FormatError(ValueError):
    """The source cannot be converted without changing what the draft computes."""


def detect_format(folder: Path) -> str:
    """'speculators' or 'sglang' from the folder's config.json."""
    config = json.loads((Path(folder) / "config.json").read_text())
    return "speculators" if is_speculators_config(config) else "sglang"


def _recorded(record: dict | None, key: str, count: int) -> list[int] | None:
    """The training record's list under `key` when it has one id per captured layer, else None."""
    value = (record or {}).get(key)
    return [int(i) for i in value] if isinstance(value, list) and len(value) == count else None


def sglang_to_speculators_config(config: dict, verifier: str | None = None, speculative_tokens: int = 3,
                                 record: dict | None = None) -> dict:
    """record: the draft's training record; its capture points become the speculators ids (else SGLang id + 1)."""
    archs = config.get("architectures") or []
    if archs[:1] != [ARCH]:
        raise FormatError(f"architectures: {archs} is not an SGLang EAGLE-3 draft ({ARCH})")
    eagle = config.get("eagle_config") or {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    layer = {k: copy.deepcopy(v) for k, v in config.items() if k not in _TOP_LEVEL}
    layer.setdefault("model_type", "llama")
    layer["architectures"] = ["LlamaForCausalLM"]
    out = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]},
        },
        "transformer_layer_config": layer,
        "draft_vocab_size": config.get("draft_vocab_size"),
        "target_hidden_size": config.get("target_hidden_size", config.get("hidden_size")),
        # None keeps each engine's default, which selects the same layers in both (outputs [1, L//2-1, L-4]).
        "eagle_aux_hidden_state_layer_ids": None if ids is None else _speculators_ids(ids, record),
        # SGLang's classic EAGLE-3 layer keeps the un-normed hidden state as the residual.
        "norm_before_residual": False,
        "embed_requires_grad": False,
    }
    for flag in _NORM_FLAGS:
        out[flag] = bool(config.get(flag) or eagle.get(flag) or (flag == "fc_norm" and config.get("use_aux_norm")))
    return out


def _points_for(ids: list, record: dict | None) -> list[int] | None:
    """The recorded capture points of these SGLang ids, when the record was trained on these ids."""
    if _recorded(record, "layer_ids", len(ids)) != [int(i) for i in ids]:
        return None
    return _recorded(record, "capture_points", len(ids))


def _speculators_ids(ids: list, record: dict | None) -> list[int]:
    points = _points_for(ids, record)
    if points is None:
        log.warning("convert: no training record gives the capture points of SGLang ids %s; using %s", ids, LLAMA_RULE)
        return [int(i) + 1 for i in ids]
    return points


def _ids_for(points: list, record: dict | None) -> list[int] | None:
    """The recorded SGLang ids of these capture points, when the record captured these points."""
    if _recorded(record, "capture_points", len(points)) != [int(i) for i in points]:
        return None
    return _recorded(record, "layer_ids", len(points))


def speculators_to_sglang_config(spec: dict, record: dict | None = None) -> dict:
    """record: the draft's training record; its SGLang ids replace the speculators ids (else id - 1)."""
    if spec.get("norm_before_residual"):
        raise FormatError("norm_before_residual: true (speculators' training default) computes a different graph "
                          "from SGLang's EAGLE-3 layer, which keeps the un-normed residual; renaming keys cannot fix "
                          "that. Retrain with norm_before_residual=false or serve it with vLLM.")
    layer = copy.deepcopy(spec.get("transformer_layer_config") or {})
    if not layer:
        raise FormatError("transformer_layer_config: missing")
    config = {k: v for k, v in layer.items() if k != "architectures"}
    config["architectures"] = [ARCH]
    config.setdefault("model_type", "llama")
    config["draft_vocab_size"] = spec.get("draft_vocab_size")
    # SGLang uses target_hidden_size whenever the key exists, so a null must become a number.
    config["target_hidden_size"] = spec.get("target_hidden_size") or config.get("hidden_size")
    config["tie_word_embeddings"] = False
    ids = spec.get("eagle_aux_hidden_state_layer_ids")
    if ids is not None:
        sglang_ids = _ids_for(ids, record)
        if sglang_ids is None:
            log.warning("convert: no training record names the SGLang ids of capture points %s; using %s", ids,
                        LLAMA_RULE)
            sglang_ids = [int(i) - 1 for i in ids]
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": sglang_ids,
                                  "use_aux_hidden_state": True}
    for flag in _NORM_FLAGS:
        if spec.get(flag):
            config[flag] = True
    return config


def _speculators_names(tensors: dict) -> dict:
    return {k.replace("midlayer.", "layers.0."): v for k, v in tensors.items()}


def convert(src: Path, dst: Path, to: str, verifier: str | None = None, speculative_tokens: int = 3,
            force: bool = False) -> Path:
    """Writes `dst` (config.json + model.safetensors) in format `to`; every tensor is copied unchanged. A `dst`
    holding files convert did not write is refused unless `force`; either way it is replaced whole."""
    src, dst = Path(src), Path(dst)
    if to not in ("sglang", "speculators"):
        raise ValueError(f"to: {to!r} is not one of sglang, speculators")
    if speculative_tokens < 1:
        raise ValueError(f"--speculative-tokens: {speculative_tokens}, must be at least 1 (the draft proposes "
                         "that many tokens a step)")
    if not (src / "config.json").is_file():
        raise ValueError(f"{src}: no config.json (not a draft folder)")
    if src.resolve() == dst.resolve():
        raise ValueError("dst must differ from src")
    check_destination(dst, "convert", force)
    config = json.loads((src / "config.json").read_text())
    read_headers(src)  # every weight file whole: a partial copy is named, not converted
    record = _source_record(src)
    source = "speculators" if is_speculators_config(config) else "sglang"
    if source == to:
        new_config = config
    elif to == "speculators":
        new_config = sglang_to_speculators_config(config, verifier, speculative_tokens, record)
    else:
        new_config = speculators_to_sglang_config(config, record)
    tensors = load_tensors(src)
    if to == "speculators":
        tensors = _speculators_names(tensors)
    with owned_folder(dst, "convert", force) as out:
        atomic_save_safetensors(out / "model.safetensors", tensors, metadata={"format": "pt"})
        atomic_write_json(out / "config.json", new_config)
        if record is not None:  # the same weights, so the same training record, sealed over the new files
            draft_provenance.write_sealed(out, record)
    return dst


def _source_record(src: Path) -> dict | None:
    """The source's training record, refused when the source changed after export: converting would seal the
    changed files as if they were the trained ones."""
    record = draft_provenance.read(src)
    if record is None or "files" not in record:
        return record
    changed = draft_provenance.changed_files(src, record)
    if changed:
        name, what = next(iter(changed.items()))
        raise ValueError(f"{src / name}: {what}; check it with `python -m draftlab check-draft {src} "
                         f"--allow-modified`, or remove {draft_provenance.FILE} to convert it unsealed")
    return record


def convert_main(argv: list[str] | None = None) -> int:
    import sys

    from draftlab.util.cli_parser import ArgumentParser

    parser = ArgumentParser(prog="python -m draftlab convert",
                            description="Convert a draft between SGLang and vLLM speculators format.")
    parser.add_argument("src")
    parser.add_argument("dst")
    parser.add_argument("--to", choices=("sglang", "speculators"), required=True)
    parser.add_argument("--verifier", help="target name or path recorded in speculators_config.verifier")
    parser.add_argument("--speculative-tokens", type=int, default=3)
    parser.add_argument("--force", action="store_true",
                        help="replace a dst that holds files convert did not write (a new folder is swapped in)")
    args = parser.parse_args(argv)
    try:
        out = convert(Path(args.src), Path(args.dst), args.to, args.verifier, args.speculative_tokens,
                      args.force)
    except (FormatError, ValueError, OSError) as err:  # bad input: one line, exit 2 (json errors are ValueErrors)
        print(f"convert: {err}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({args.to} format)")
    return 0
