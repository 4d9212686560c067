"""check-draft refuses a draft changed after export, naming the file, and what the weights alone give away.

Each changed folder is a copy of a real export (the `good` fixture) changed by hand: a norm scaled out of range,
rope_theta edited, a head row blown up, d2t no longer one-to-one, a weight file cut short. The hash seal catches
each change, naming the file, and every other check still runs in the same report, so the real defect shows
too; `--allow-modified` turns the seal's errors into warnings.
"""

from __future__ import annotations

import json

import pytest
import torch

from draftlab.sglang import draft_provenance
from draftlab.sglang.export import export_draft
from draftlab.sglang.check import check_draft, check_draft_main
from draftlab.sglang.formats import convert
from test_check_draft_provenance import broken_copy, good, where  # noqa: F401 - `good` is a fixture


def edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    for key, scale in changes.items():
        config[key] = config[key] * scale
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_export_seals_config_and_weights(good):
    files = draft_provenance.read(good)["files"]
    assert set(files) == {"config.json", "model.safetensors"}
    assert all(value.startswith("sha256:") and len(value) == 7 + 64 for value in files.values())
    assert draft_provenance.changed_files(good, draft_provenance.read(good)) == {}


def test_scaled_norm_is_refused_naming_the_weight_file(good, tmp_path, capsys):
    folder = broken_copy(good, tmp_path, tensors=lambda s: {
        "layers.0.hidden_norm.weight": torch.full_like(s["layers.0.hidden_norm.weight"], 1e6)})
    report = check_draft(folder)
    # the seal names the file, and the same run shows what changed in it
    assert where(report) == {"model.safetensors", "layers.0.hidden_norm.weight"}, report.summary()
    assert check_draft_main([str(folder)]) == 1
    err = capsys.readouterr().err
    assert "ERROR model.safetensors: content changed after export" in err and "far outside the range" in err
    modified = check_draft(folder, allow_modified=True)  # the weights alone give it away as well
    assert where(modified) == {"layers.0.hidden_norm.weight"}, modified.summary()
    assert "far outside the range" in modified.summary()


def test_edited_config_is_refused_and_checked_with_allow_modified(good, tmp_path, capsys):
    folder = edit_config(broken_copy(good, tmp_path), rope_theta=10)
    report = check_draft(folder)
    assert where(report) == {"config.json"} and "--allow-modified" in report.summary()
    assert check_draft_main([str(folder)]) == 1
    assert check_draft_main([str(folder), "--allow-modified"]) == 0  # nothing else is wrong with it
    out = capsys.readouterr().out
    assert "WARNING config.json: content changed after export" in out
    assert "a modified draft cannot get" in out
    modified = check_draft(folder, allow_modified=True)
    assert modified.ok and {"config.json", draft_provenance.FILE} <= {f.where for f in modified.findings}


def test_added_weight_file_is_a_change(good, tmp_path):
    folder = broken_copy(good, tmp_path)
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    report = check_draft(folder)
    assert where(report) == {"model.safetensors", "model-00001-of-00001.safetensors"}, report.summary()


def test_a_seal_refusal_still_reports_the_real_defect(good, tmp_path):
    """A changed file is refused by name, and the checks SGLang's reading needs still run: here the edit that
    makes SGLang feed the draft the last hidden state is named in the same report."""
    folder = broken_copy(good, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["eagle_config"]["use_aux_hidden_state"] = False
    (folder / "config.json").write_text(json.dumps(config))
    report = check_draft(folder)
    assert where(report) == {"config.json", "eagle_config.use_aux_hidden_state"}, report.summary()
    (folder / "model.safetensors").unlink()
    assert {"model.safetensors", "eagle_config.use_aux_hidden_state"} <= where(check_draft(folder))


def test_dominant_head_rows_are_refused(good, tmp_path):
    def loud(state):
        head = state["lm_head.weight"].clone()
        head[3] *= 1000
        return {"lm_head.weight": head}

    report = check_draft(broken_copy(good, tmp_path, tensors=loud), allow_modified=True)
    assert where(report) == {"lm_head.weight"}, report.summary()
    assert "draft id(s) [3]" in report.summary()


def test_d2t_not_one_to_one_is_an_error(good, tmp_path):
    def collide(state):
        d2t = state["d2t"].clone()
        d2t[1] = d2t[0] - 1  # draft ids 0 and 1 now both stand for target token d2t[0]
        return {"d2t": d2t}

    report = check_draft(broken_copy(good, tmp_path, tensors=collide), allow_modified=True)
    assert where(report) == {"d2t"} and "not one-to-one" in report.summary(), report.summary()


def test_cut_short_weight_file_is_one_line_exit_2(good, tmp_path, capsys):
    folder = broken_copy(good, tmp_path)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    for size, what in ((len(data) // 2, "cut short"), (20, "cut short"), (3, "too short")):
        weights.write_bytes(data[:size])
        for argv in ([str(folder)], [str(folder), "--allow-modified"]):
            assert check_draft_main(argv) == 2
            lines = capsys.readouterr().err.strip().splitlines()
            assert len(lines) == 1 and str(weights) in lines[0] and what in lines[0], lines
    weights.write_bytes(data[:8] + b"{not json" + data[17:])
    assert check_draft_main([str(folder)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert check_draft(folder).refusal.where == "model.safetensors"


def test_unreadable_config_is_one_line_exit_2(good, tmp_path, capsys):
    folder = broken_copy(good, tmp_path)
    (folder / "config.json").write_text('{"hidden_size": 16,')
    assert check_draft_main([str(folder)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "config.json" in lines[0] and "not valid JSON" in lines[0]


def test_convert_and_reexport_write_a_new_record(good, tmp_path):
    spec = convert(good, tmp_path / "spec", "speculators")
    back = convert(spec, tmp_path / "back", "sglang")
    for folder in (spec, back):
        record = draft_provenance.read(folder)
        assert draft_provenance.changed_files(folder, record) == {}
        assert record["layer_ids"] == draft_provenance.read(good)["layer_ids"]
    assert check_draft(back).ok
    changed = edit_config(broken_copy(good, tmp_path), rope_theta=10)
    with pytest.raises(ValueError, match="config.json: content changed after export"):
        convert(changed, tmp_path / "from-changed", "speculators")  # sealing it would vouch for the change

    from draftlab.sglang.export import load_draft
    from draftlab.model.draft import DraftModelConfig

    model = load_draft(good)
    with torch.no_grad():
        model.norm.weight.mul_(1.5)
    cfg = DraftModelConfig.from_hf_config(json.loads((good / "config.json").read_text()))
    export_draft(model, cfg, good, "bfloat16", provenance=draft_provenance.read(good))
    assert check_draft(good).ok  # the record now vouches for the new weights


def test_record_without_hashes_is_read_with_a_warning(good, tmp_path):
    folder = broken_copy(good, tmp_path)
    record = draft_provenance.read(folder)
    record.pop("files")
    record["format"] = draft_provenance.UNSEALED_FORMAT
    (folder / draft_provenance.FILE).write_text(json.dumps(record))
    report = check_draft(folder)
    assert report.ok and "no content hashes" in report.summary()


def test_convert_refuses_a_cut_short_source_in_one_line(good, tmp_path, capsys):
    from draftlab.sglang.formats import convert_main

    folder = broken_copy(good, tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    assert convert_main([str(folder), str(tmp_path / "out"), "--to", "speculators"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"{weights}: cut short" in lines[0]
