"""Writes a trained draft as a folder SGLang loads (`LlamaForCausalLMEagle3`), and reads such a folder back.

The folder is `config.json` + `model.safetensors` (+ `draftlab_provenance.json`, see draft_provenance.py), where
the tensors are the model's plain state dict: our parameter names are already the checkpoint keys SGLang expects
(see model/draft.py), `d2t` holds offsets and `t2d` is a bool mask. The embedding is included: SGLang swaps in
the target's when the widths agree, but keeps the draft's own otherwise. The folder appears complete or not at all
(written beside it, then renamed).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from draftlab.sglang import draft_provenance
from draftlab.util.fsutil import owned_folder
from draftlab.model.draft import DraftModelConfig, Eagle3Draft

# what an export writes: an older export's folder (without fsutil's writer record) may be replaced
OWN_FILES = ("config.json", "model.safetensors", draft_provenance.FILE)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def export_draft(model: Eagle3Draft, cfg: DraftModelConfig, folder: Path, torch_dtype: str = "bfloat16",
                 provenance: dict | None = None, force: bool = False) -> Path:
    """`provenance` (draft_provenance.from_extract_manifest) is written beside the weights with their content
    hashes, so that `check-draft DIR` can check the draft against the features it was trained on without flags,
    and tell a draft changed after export from the trained one. A `folder` holding files an export did not write
    is refused unless `force` (fsutil.owned_folder)."""
    folder = Path(folder)
    dtype = DTYPES[torch_dtype]
    tensors = {}
    for name, value in model.state_dict().items():
        value = value.detach().cpu()
        tensors[name] = value.to(dtype) if value.is_floating_point() else value  # d2t int64, t2d bool untouched
    with owned_folder(folder, "export", force, OWN_FILES) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg.to_hf_config(torch_dtype), indent=2, sort_keys=True) + "\n")
        if provenance is not None:  # sealed with the hashes of the files just written
            draft_provenance.write_sealed(tmp, provenance)
    return folder


def load_draft(folder: Path, dtype: torch.dtype = torch.float32) -> Eagle3Draft:
    """Reads a folder in exactly the export format (strict: every key present and consumed)."""
    folder = Path(folder)
    cfg = DraftModelConfig.from_hf_config(json.loads((folder / "config.json").read_text()))
    model = Eagle3Draft(cfg)
    state = load_file(str(folder / "model.safetensors"))
    model.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}, strict=True)
    return model.to(dtype)
