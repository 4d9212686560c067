"""Nothing is overwritten: convert, bundle and export refuse a destination holding files they did not write,
and with --force swap a new folder in whole."""

import hashlib

import pytest

from draftlab.util.fsutil import DestinationError, owned_folder
from draftlab.offline import bundle
from draftlab.sglang.formats import convert, convert_main
from sglang_fixtures import write_draft, write_target


def snapshot(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_convert_onto_a_model_folder_refuses_and_leaves_it_byte_for_byte(tmp_path, capsys):
    src = write_draft(tmp_path / "draft")
    model = write_target(tmp_path / "model")
    (model / "model.safetensors").write_bytes(b"target weights")
    before = snapshot(model)
    assert convert_main([str(src), str(model), "--to", "speculators"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(model) in err and "--force" in err and "config.json" in err
    assert snapshot(model) == before


def test_convert_reruns_into_its_own_output_and_force_swaps_a_foreign_folder(tmp_path):
    src = write_draft(tmp_path / "draft")
    out = convert(src, tmp_path / "out", "speculators")
    convert(src, out, "speculators")  # its own output: replaced without --force
    model = write_target(tmp_path / "model")
    (model / "tokenizer.json").write_text("{}")
    convert(src, model, "speculators", force=True)
    assert not (model / "tokenizer.json").exists()  # a new folder swapped in, not files written among the old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["draft", "model", "out"]


def test_convert_refuses_zero_speculative_tokens(tmp_path, capsys):
    src = write_draft(tmp_path / "draft")
    assert convert_main([str(src), str(tmp_path / "out"), "--to", "speculators", "--speculative-tokens", "0"]) == 2
    assert "--speculative-tokens" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_bundle_onto_a_file_or_a_foreign_folder_refuses_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bundle, "repo_root", lambda: pytest.fail("bundle started work before refusing"))
    target = tmp_path / "out.txt"
    target.write_text("keep me")
    assert bundle.main([str(target)]) == 2
    assert "is a file" in capsys.readouterr().err and target.read_text() == "keep me"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.md").write_text("mine")
    assert bundle.main([str(tmp_path / "other")]) == 2
    assert "notes.md" in capsys.readouterr().err


def test_owned_folder_failing_block_leaves_the_old_folder(tmp_path):
    with owned_folder(tmp_path / "d", "w") as out:
        (out / "a.txt").write_text("1")
    with pytest.raises(RuntimeError), owned_folder(tmp_path / "d", "w") as out:
        (out / "a.txt").write_text("2")
        raise RuntimeError("failed mid-write")
    assert (tmp_path / "d" / "a.txt").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    (tmp_path / "d" / "b.txt").write_text("added by hand")
    with pytest.raises(DestinationError, match="b.txt"), owned_folder(tmp_path / "d", "w"):
        pass
