"""`check-draft DIR` with no flags refuses the faulty drafts of issue 14, using the folder's own provenance record.

Each faulty folder is a copy of a good export (sglang/export.py, with the record the train stage writes) with one thing
broken, as a user would break it: fc cut to one layer with a single id, the ids shifted by one, NaN weights.
The record's hashes would refuse each of them outright (test_check_draft_seal.py); here they are checked with
--allow-modified, so that each check is seen to catch its fault on its own.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftlab.sglang import draft_provenance
from draftlab.sglang.export import export_draft
from draftlab.model.draft import DraftModelConfig, Eagle3Draft
from draftlab.sglang.check import check_draft, check_draft_main

H, L, IDS = 16, 8, [1, 3, 4]  # a Llama-shaped target: ids [1, L//2-1, L-4]


def extract_manifest() -> dict:
    config = {"model_type": "llama", "hidden_size": H, "num_hidden_layers": L, "vocab_size": 64,
              "max_position_embeddings": 2048}
    return {"format": "draftlab.features/1", "mode": "offline", "layer_ids": IDS, "convention": "output",
            "dtype": "float32", "samples_fingerprint": "abc",
            "target": {"name": "tiny", "fingerprint": "tiny-123", "config": config, "hidden_size": H,
                       "num_layers": L, "vocab_size": 64}}


@pytest.fixture
def good(tmp_path):
    cfg = DraftModelConfig(hidden_size=H, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
                           head_dim=8, target_hidden_size=H, aux_layer_ids=IDS, vocab_size=64, draft_vocab_size=32,
                           num_hidden_layers=1, max_position_embeddings=2048)
    torch.manual_seed(0)
    model = Eagle3Draft(cfg)
    d2t = torch.arange(0, 64, 2)[:32] - torch.arange(32)
    t2d = torch.zeros(64, dtype=torch.bool)
    t2d[torch.arange(0, 64, 2)] = True
    model.init_from_target(torch.randn(64, H), torch.randn(64, H), d2t, t2d)
    return export_draft(model, cfg, tmp_path / "good", "bfloat16",
                        provenance=draft_provenance.from_extract_manifest(extract_manifest()))


def broken_copy(good, tmp_path, ids=None, tensors=None):
    folder = tmp_path / "broken"
    shutil.copytree(good, folder)
    if ids is not None:
        config = json.loads((folder / "config.json").read_text())
        config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
        (folder / "config.json").write_text(json.dumps(config))
    if tensors is not None:
        state = load_file(str(folder / "model.safetensors"))
        state.update(tensors(state))
        save_file(state, str(folder / "model.safetensors"))
    return folder


def where(report) -> set[str]:
    return {f.where for f in report.errors}


def test_export_records_the_training_features(good):
    prov = draft_provenance.read(good)
    assert prov["layer_ids"] == IDS and prov["feature_width"] == 3 * H
    assert prov["target"]["fingerprint"] == "tiny-123"
    assert prov["extract_fingerprint"] == draft_provenance.extract_fingerprint(extract_manifest())


def test_good_export_passes_with_no_flags(good, capsys):
    report = check_draft(good)
    assert report.ok, report.summary()
    assert check_draft_main([str(good)]) == 0


def test_single_layer_fc_with_single_id_is_refused(good, tmp_path):
    folder = broken_copy(good, tmp_path, ids=[4], tensors=lambda s: {"fc.weight": s["fc.weight"][:, -H:].clone()})
    report = check_draft(folder, allow_modified=True)
    assert {"fc.weight", "eagle_config.eagle_aux_hidden_state_layer_ids"} <= where(report), report.summary()
    assert "1 layer(s)" in report.summary()
    assert check_draft_main([str(folder), "--allow-modified"]) == 1


def test_ids_shifted_by_one_are_refused(good, tmp_path):
    folder = broken_copy(good, tmp_path, ids=[i + 1 for i in IDS])
    report = check_draft(folder, allow_modified=True)
    assert where(report) == {"eagle_config.eagle_aux_hidden_state_layer_ids"}, report.summary()
    assert check_draft_main([str(folder), "--allow-modified"]) == 1


def test_nan_weights_are_refused(good, tmp_path):
    def poison(state):
        w = state["layers.0.mlp.down_proj.weight"].clone()
        w[0, 0] = float("nan")
        return {"layers.0.mlp.down_proj.weight": w}

    folder = broken_copy(good, tmp_path, tensors=poison)
    report = check_draft(folder, allow_modified=True)
    assert where(report) == {"layers.0.mlp.down_proj.weight"}, report.summary()
    assert "NaN or Inf" in report.summary()
    assert check_draft_main([str(folder), "--allow-modified"]) == 1
    assert check_draft(folder, scan_weights=False, allow_modified=True).ok  # headers alone cannot see it


def test_all_zero_tensor_is_refused(good, tmp_path):
    folder = broken_copy(good, tmp_path, tensors=lambda s: {"fc.weight": torch.zeros_like(s["fc.weight"])})
    report = check_draft(folder, allow_modified=True)
    assert where(report) == {"fc.weight"} and "zero" in report.summary()


def test_other_target_than_trained_on_is_refused(good, tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": H, "num_hidden_layers": 12,
                                                    "vocab_size": 64, "max_position_embeddings": 2048}))
    report = check_draft(good, target)
    assert "--target" in where(report), report.summary()


def test_without_record_it_warns(good, tmp_path):
    folder = broken_copy(good, tmp_path)
    (folder / draft_provenance.FILE).unlink()
    report = check_draft(folder)
    assert report.ok and draft_provenance.FILE in {f.where for f in report.findings}


def test_trained_draft_passes_with_no_flags_and_records_its_features(tiny_cfg):
    """The train stage's real export: the record matches the extract manifest, and check-draft needs no flags."""
    from draftlab.config.config import validate
    from draftlab.pipeline import plan, run_stages
    from draftlab.util.reporting import NullReporter

    cfg = validate(tiny_cfg("tracking.enabled=false"))
    run_stages(cfg, NullReporter(), names=["generate", "extract", "train"])
    folders = plan(cfg)
    manifest = json.loads((folders["extract"].folder / "manifest.json").read_text())
    draft = folders["train"].folder / "draft"
    prov = draft_provenance.read(draft)
    assert prov["layer_ids"] == manifest["layer_ids"]
    assert prov["feature_width"] == manifest["shapes"]["features"][1]
    assert prov["extract_fingerprint"] == draft_provenance.extract_fingerprint(manifest)
    assert prov["target"]["fingerprint"] == manifest["target"]["fingerprint"]
    report = check_draft(draft)
    assert report.ok, report.summary()
