"""check-draft: everything SGLang 0.5.23 would get wrong about a draft folder, found before a 15-minute start.

Files first: config.json and every safetensors file must be readable and whole (a partial copy is refused in one
line, exit 2), and match the content hashes the draft's own training record (draftlab_provenance.json) sealed
at export (a changed file is an error; the other checks still run, so that the change's effect is seen). Then
config rules (no torch; every key SGLang reads, draft_keys.py), the safetensors headers replayed through
`keymap`, the record's layer ids and fc width, and a scan of every tensor (check_trained.py). Each finding
names the config key or checkpoint key at fault. Errors are things that crash SGLang after the target has
loaded or, worse, make it serve at accept length ~1 without a word.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from draftlab.util.cli_parser import ArgumentParser
from draftlab.sglang import check_trained as trained
from draftlab.sglang import draft_keys, keymap
from draftlab.sglang.capture import CaptureError, for_target, resolve_version
from draftlab.sglang.st_files import INT_DTYPES, DraftFilesError, UnreadableFile, load_tensors, read_headers
from draftlab.sglang.targetinfo import load_target_config, manifest_layer_ids
from draftlab.target.target_shape import text_config

ARCH = "LlamaForCausalLMEagle3"
REQUIRED = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size")


@dataclass
class Finding:
    level: str  # "error" | "warning"
    where: str  # the config key or checkpoint key at fault
    message: str

    def __str__(self) -> str:
        return f"{self.level.upper()} {self.where}: {self.message}"


@dataclass
class CheckReport:
    folder: Path
    rules: str
    findings: list[Finding] = field(default_factory=list)
    keys: keymap.KeyReport | None = None
    speculators_format: bool = False
    refusal: Finding | None = None  # a file that cannot be read: nothing else was checked
    sglang_version: str | None = None  # whose capture contract applies (None: capture.resolve_version's default)


    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def error(self, where: str, message: str) -> None:
        self.findings.append(Finding("error", where, message))

    def warn(self, where: str, message: str) -> None:
        self.findings.append(Finding("warning", where, message))

    def refuse(self, where: str, message: str) -> None:
        self.refusal = Finding("error", where, message)
        self.findings.append(self.refusal)

    def summary(self) -> str:
        head = f"check-draft {self.folder} (SGLang rules: {self.rules}): "
        head += "OK" if self.ok else f"{len(self.errors)} error(s)"
        return "\n".join([head] + [f"  {f}" for f in self.findings])


def is_speculators_config(config: dict) -> bool:
    return "speculators_config" in config or "transformer_layer_config" in config or \
        "Eagle3Speculator" in (config.get("architectures") or [])


def check_draft(folder, target=None, rules: str = "current", extract_manifest=None,
                scan_weights: bool = True, allow_modified: bool = False,
                sglang_version: str | None = None) -> CheckReport:
    """With no target or manifest, the folder's draftlab_provenance.json (if any) supplies the target's facts and
    the training features' layer ids and width; `scan_weights` also reads every tensor (NaN/Inf, all zeros, norm
    range, head rows). A draft changed after export is refused unless `allow_modified`."""
    from safetensors import SafetensorError

    report = CheckReport(Path(folder), rules, sglang_version=sglang_version)
    try:
        return _check_draft(Path(folder), target, rules, extract_manifest, scan_weights, allow_modified,
                            sglang_version)
    except UnreadableFile as err:
        report.refuse(err.path.name, str(err))
    except SafetensorError as err:  # a fault the header checks do not foresee: still named, still one line
        report.refuse("model.safetensors", f"{folder}: a weight file cannot be read ({err})")
    return report


def _check_draft(folder: Path, target, rules: str, extract_manifest, scan_weights: bool,
                 allow_modified: bool, sglang_version: str | None) -> CheckReport:
    report = CheckReport(folder, rules, sglang_version=sglang_version)
    config_path = folder / "config.json"
    if not config_path.exists():
        report.refuse("config.json", f"{folder}: no config.json, so not a draft folder")
        return report
    try:
        config = json.loads(config_path.read_text())
    except OSError as err:
        raise UnreadableFile(config_path, f"cannot be read ({err.strerror or err})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UnreadableFile(config_path, f"not valid JSON ({err})") from None
    if not isinstance(config, dict):
        raise UnreadableFile(config_path, f"a JSON {type(config).__name__}, not an object")
    if is_speculators_config(config):
        report.speculators_format = True
        report.error("config.json", "this is a vLLM speculators-format draft (speculators_config / "
                     "transformer_layer_config / Eagle3Speculator); SGLang 0.5.23 cannot load it. Convert it: "
                     f"python -m draftlab convert {folder} <dst> --to sglang")
        return report
    if not isinstance(config.get("eagle_config") or {}, dict):  # every later check reads keys from it
        draft_keys.check_eagle_config(report, config)
        return report
    try:  # every weight file whole before anything reads tensors from it
        headers, files_error = read_headers(folder), None
    except UnreadableFile:
        raise  # check_draft refuses the whole folder
    except (DraftFilesError, ValueError) as err:
        headers, files_error = None, str(err)
    prov = trained.load_provenance(report, folder)
    if prov is not None:  # a broken seal is an error; every other check still runs, to show the real defect
        trained.check_seal(report, folder, prov, allow_modified)
    target_cfg, why = load_target_config(target)
    if why and target is not None:
        report.error("--target", why)
    elif why and prov is None:
        report.warn("--target", why)
    tcfg = text_config(target_cfg) if target_cfg else None
    if prov is not None:
        if tcfg is None:
            tcfg = trained.target_from_provenance(prov)
        else:
            trained.check_target_agrees(report, prov, tcfg)
        trained.check_layer_ids(report, config, prov)
        tcfg = {**tcfg, "capture_points": prov.get("capture_points")}
    _check_config(report, config, tcfg)
    draft_keys.check_keys(report, config, tcfg, headers, trained=prov is not None)
    _check_layer_ids(report, config, tcfg, extract_manifest)
    if any(k not in config for k in REQUIRED) or report.rules not in keymap.RULES:
        return report  # shapes cannot be derived; the config errors say why
    if files_error is not None:
        report.error("model.safetensors", files_error)
        return report
    _check_tensors(report, folder, config, tcfg, headers)
    if prov is not None:
        trained.check_fc_width(report, headers, prov)
    if scan_weights:
        trained.scan_weights(report, folder)
    return report


def _check_config(report: CheckReport, config: dict, target: dict | None) -> None:
    archs = config.get("architectures") or []
    if not archs or archs[0] != ARCH:
        eagle_repo = archs[:1] == ["LlamaForCausalLM"]
        hint = " (the EAGLE repo's name; SGLang loads it as a plain target model)" if eagle_repo else ""
        report.error("architectures", f"{archs} must start with {ARCH!r}{hint}")
    for key in REQUIRED:
        if key not in config:
            report.error(key, "missing: SGLang derives parameter shapes from it")
    if "model_type" not in config:
        report.error("model_type", "missing: transformers cannot build the config class (use 'llama')")
    if "draft_vocab_size" not in config:
        report.error("draft_vocab_size", "missing: SGLang reads config.draft_vocab_size and fails with AttributeError "
                     "(use null to share the target's head)")
    dv, vocab = config.get("draft_vocab_size"), config.get("vocab_size")
    if config.get("tie_word_embeddings"):
        if dv is not None and dv != vocab:
            report.error("tie_word_embeddings", f"true with draft_vocab_size {dv} != vocab_size {vocab}: SGLang uses "
                         "the first rows of the target embedding as the head and drops lm_head.weight (accept ~1)")
        else:
            report.warn("tie_word_embeddings", "true: lm_head.weight in the checkpoint is ignored")
    if "target_hidden_size" in config and config["target_hidden_size"] is None:
        report.error("target_hidden_size", "null: SGLang uses the key whenever it exists and cannot size fc from null")
    if "max_position_embeddings" not in config:
        report.warn("max_position_embeddings", "missing: the transformers default (2048) becomes the draft's context")
    dtype = config.get("torch_dtype") or config.get("dtype")
    if not dtype:
        report.error("torch_dtype", "not set: under --dtype auto SGLang picks the draft dtype from it")
    elif dtype == "float32":
        report.warn("torch_dtype", "float32 becomes float16 under --dtype auto; launch with an explicit --dtype")
    if not target:
        return
    if vocab is not None and vocab != target.get("vocab_size"):
        report.error("vocab_size", f"{vocab} != target vocab_size {target.get('vocab_size')}")
    want = config.get("target_hidden_size") or config.get("hidden_size")
    if want is not None and want != target.get("hidden_size"):
        key = "target_hidden_size" if config.get("target_hidden_size") else "hidden_size"
        report.error(key, f"{want} != target hidden_size {target.get('hidden_size')}")
    ctx, target_ctx = config.get("max_position_embeddings", 2048), target.get("max_position_embeddings")
    if target_ctx and ctx < target_ctx:
        report.error("max_position_embeddings", f"{ctx} < target context {target_ctx}: SGLang raises ValueError after "
                     "the target loaded (or set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 knowingly and launch "
                     "with a --context-length the draft was trained for)")
    target_dtype = target.get("torch_dtype") or target.get("dtype")
    if dtype and target_dtype and dtype != target_dtype:
        report.warn("torch_dtype", f"{dtype} differs from the target's {target_dtype}; pass --dtype explicitly")


def _check_layer_ids(report: CheckReport, config: dict, target: dict | None, manifest) -> None:
    eagle = config.get("eagle_config") or {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        if "eagle_aux_hidden_state_layer_ids" in config:
            report.error("eagle_aux_hidden_state_layer_ids", "top-level ids are ignored by SGLang's target capture; "
                         "move them to eagle_config.eagle_aux_hidden_state_layer_ids")
        else:
            report.warn("eagle_config.eagle_aux_hidden_state_layer_ids", "absent: SGLang captures its default "
                        "(outputs of layers [1, L//2-1, L-4])")
        return
    where = "eagle_config.eagle_aux_hidden_state_layer_ids"
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        report.error(where, f"{ids!r} must be a non-empty list of integers")
        return
    if len(set(ids)) != len(ids) or ids != sorted(ids):
        report.error(where, f"{ids} must be strictly ascending: SGLang concatenates in ascending layer order "
                     "and collapses duplicates")
    if any(i < 0 for i in ids):
        report.error(where, f"{ids}: negative layer id")
    n_aux = config.get("num_aux_hidden_states")
    if n_aux is not None and n_aux != len(ids):
        report.error("num_aux_hidden_states", f"{n_aux} != {len(ids)} layer ids; SGLang sizes fc from num_aux")
    if target:
        _check_capture(report, where, ids, target)
    used = manifest_layer_ids(manifest)
    if used is not None and list(used) != list(ids):
        report.error(where, f"{ids} != {used}, the layer ids extraction used for training (extract manifest): "
                     "SGLang would feed the draft other layers than it learned on")


def _check_capture(report: CheckReport, where: str, ids: list[int], target: dict) -> None:
    """What SGLang captures for `ids` on this target's class (its capture contract), against what it can capture
    and what the draft was trained on (the provenance's capture points)."""
    try:
        capture = for_target(target, version=report.sglang_version)
    except CaptureError as err:
        report.error("target", str(err))
        return
    L = target.get("num_hidden_layers")
    if L is None:
        return
    points = capture.points(ids, L)
    top = capture.top(L)
    lost = [i for i, c in zip(ids, points) if c > top]
    if lost:
        report.error(where, f"{ids}: ids {lost} cannot be captured by SGLang {capture.version} on a {L}-layer "
                     f"{capture.arch} target (capture points {points}, 0..{top} exist): the draft would get fewer "
                     "layers than fc expects")
    trained_at = target.get("capture_points")
    if trained_at is not None and list(trained_at) != points:
        report.error(where, f"{ids}: SGLang captures points {points} on {capture.arch} (ids rule {capture.rule}), "
                     f"the features were extracted at {list(trained_at)}: the draft would see other layers")


def _check_tensors(report: CheckReport, folder: Path, config: dict, target: dict | None, headers: dict) -> None:
    keys = keymap.map_keys({k: v["shape"] for k, v in headers.items()}, config, report.rules)
    report.keys = keys
    arch = keymap.arch_from_config(config, report.rules)
    for key, shape in keys.dropped.items():
        report.error(key, f"{list(shape)} is dropped silently by SGLang ({report.rules} rules): it has neither "
                     f"'{keys.looked_up[key]}' nor 'model.{keys.looked_up[key]}'")
    target_hidden = (target or {}).get("hidden_size") or arch.hidden_in
    for land in keys.mismatches:
        shard = "" if land.shard is None else f"[{land.shard}]"
        extra = ""
        if land.param == "model.fc.weight" and len(land.shape) == 2:
            extra = (f"; it takes {land.shape[1] / target_hidden:g} layer(s) x {target_hidden} features, the config "
                     f"asks for {arch.num_aux}")
        report.error(land.key, f"shape {list(land.shape)} but {land.param}{shard} expects {list(land.expected)}: "
                     f"AssertionError at load, after the target has loaded{extra}")
    for param, shape in keys.never_loaded.items():
        report.error(param, f"{list(shape)} receives no checkpoint key and keeps uninitialised values{_why(param)}")
    for key, param in keys.unused_loaded.items():
        report.warn(key, f"loads into {param}, which SGLang's forward never reads (layers >= 1 normalise with "
                    "hidden_norm)")
    fc = next((land for land in keys.landed.values() if land.param == "model.fc.weight"), None)
    if fc is not None and fc.shape_ok and fc.shape[1] != arch.num_aux * target_hidden:
        # fc matches the draft config but not the target: target_hidden_size disagrees with the target
        report.error(fc.key, f"input width {fc.shape[1]} != {arch.num_aux} layers x target hidden {target_hidden}")
    _check_vocab_maps(report, folder, config, headers, keys, arch)


def _why(param: str) -> str:
    if param == "lm_head.weight":
        return " (a random head: accept length ~1)"
    if param == keymap.EMBED:
        return " (target_hidden_size != hidden_size, so SGLang does not share the target's embedding)"
    return ""


def _check_vocab_maps(report, folder, config, headers, keys: keymap.KeyReport, arch: keymap.Arch) -> None:
    dv = config.get("draft_vocab_size")
    head = next((headers[k] for k in ("lm_head.weight", "model.lm_head.weight") if k in headers), None)
    if dv is not None and head is not None and head["shape"][0] != dv:
        report.error("lm_head.weight", f"{head['shape'][0]} rows != draft_vocab_size {dv}")
    if not keys.has_d2t:
        if dv is not None and dv < arch.vocab:
            report.error("d2t", f"missing with draft_vocab_size {dv} < vocab_size {arch.vocab}: SGLang would use "
                         "draft ids as target ids (accept ~1)")
        return
    info = headers[keys.d2t_key]
    if info["dtype"] not in INT_DTYPES:
        report.error(keys.d2t_key, f"dtype {info['dtype']}: d2t must hold integer offsets")
        return
    n = info["shape"][0] if info["shape"] else 0
    if dv is not None and n != dv:
        report.error(keys.d2t_key, f"length {n} != draft_vocab_size {dv}")
    import torch

    d2t = load_tensors(folder, [keys.d2t_key])[keys.d2t_key].to(torch.int64)
    hot = d2t + torch.arange(d2t.numel())
    if hot.numel() and (int(hot.min()) < 0 or int(hot.max()) >= arch.vocab):
        report.error(keys.d2t_key, f"d2t + arange spans [{int(hot.min())}, {int(hot.max())}], outside the target "
                     f"vocabulary [0, {arch.vocab}) (offsets, not absolute ids?)")
    elif hot.unique().numel() != hot.numel():
        report.error(keys.d2t_key, f"{hot.numel() - hot.unique().numel()} draft id(s) map to a target token another "
                     "draft id maps to: d2t is not one-to-one, which a trained draft never is (a damaged file?)")


def _refuse_arguments(args) -> str | None:
    """Why the command line cannot be checked (an SGLang version without a contract, a folder, target or manifest
    that is not there), else None."""
    try:
        resolve_version(args.sglang_version)
    except CaptureError as err:
        return str(err)
    if not Path(args.folder).is_dir():
        return f"{args.folder} is not a folder"
    if args.target is not None:
        target, why = load_target_config(args.target)
        if why is None and not isinstance(target, dict):
            why = f"{args.target}: its config.json is not a JSON object"
        if why:
            return f"--target {why}"
    if args.extract_manifest is not None:
        try:
            manifest_layer_ids(args.extract_manifest)
        except (OSError, ValueError, TypeError, AttributeError) as err:
            return f"--extract-manifest {args.extract_manifest}: {getattr(err, 'strerror', None) or err}"
    return None


def check_draft_main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m draftlab check-draft",
                            description="Check a draft folder against SGLang's loading contract.")
    parser.add_argument("folder")
    parser.add_argument("--target", help="target model folder (or hub name in the local HF cache)")
    parser.add_argument("--rules", choices=keymap.RULES, default="current",
                        help="current = SGLang 0.5.23; legacy = the SGLang that only loaded midlayer.*")
    parser.add_argument("--extract-manifest", help="extract-stage manifest.json (or its folder): the layer ids used "
                        "(not needed for draftlab's exports: their draftlab_provenance.json says)")
    parser.add_argument("--no-weight-scan", action="store_true",
                        help="read headers only (skip the scan of every tensor: NaN/Inf, all zeros, norm range, "
                        "head rows)")
    parser.add_argument("--allow-modified", action="store_true",
                        help="check a draft whose weights or config.json changed after export (its "
                        "draftlab_provenance.json hashes differ) instead of refusing it")
    parser.add_argument("--sglang-version", help="the SGLang release that will serve the draft, whose capture "
                        "contract applies (default: the installed sglang's, else the newest shipped)")
    args = parser.parse_args(argv)
    refusal = _refuse_arguments(args)
    if refusal:  # bad input: one line, exit 2, before anything is checked
        print(f"check-draft: {refusal}", file=sys.stderr)
        return 2
    report = check_draft(args.folder, args.target, args.rules, args.extract_manifest,
                         scan_weights=not args.no_weight_scan, allow_modified=args.allow_modified,
                         sglang_version=args.sglang_version)
    if report.refusal is not None:  # nothing was checked: one line, as for any input that cannot be read
        print(f"check-draft: {report.refusal.message}", file=sys.stderr)
        return 2
    print(report.summary(), file=sys.stdout if report.ok else sys.stderr)
    return 0 if report.ok else 1
