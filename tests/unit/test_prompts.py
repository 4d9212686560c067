"""Prompts: ShareGPT's cut-off JSON parsed tolerantly, user files, deterministic order, split by conversation."""

import json

import pytest

from draftlab.data.prompts import load_prompts, read_json_array_tolerant, split_for


def _sharegpt(records):
    return json.dumps([{"id": f"c{i}_0", "conversations": turns} for i, turns in enumerate(records)], indent=2)


def test_cut_off_file_keeps_every_complete_record(tmp_path):
    text = _sharegpt([[{"from": "human", "value": f"question {i}"}, {"from": "gpt", "value": "x" * 50}]
                      for i in range(5)])
    cut = text[: text.rfind("question 4") + 5]  # inside the last record's string
    path = tmp_path / "cut.json"
    path.write_text(cut)
    records, truncated = read_json_array_tolerant(path)
    assert truncated and len(records) == 4


def test_malformed_record_in_the_middle_is_an_error_with_its_position(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[{"id": "a", "conversations": []}, {"id": "b" "conversations": []}, {"id": "c"}]')
    with pytest.raises(ValueError, match="bad.json:1: invalid JSON at character"):
        read_json_array_tolerant(path)


def test_embedded_sharegpt_counts():
    prompts = load_prompts("sharegpt", None, seed=0)
    assert prompts.truncated
    assert prompts.records_read == 17671
    assert len(prompts.prompts) == 54109


def test_order_is_deterministic_and_seeded_and_deduplicated(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"p{i % 30}", "id": f"c{i}"}) for i in range(60)))
    a, b, c = (load_prompts("jsonl", str(path), seed) for seed in (0, 0, 1))
    assert [p.text for p in a.prompts] == [p.text for p in b.prompts]
    assert [p.text for p in a.prompts] != [p.text for p in c.prompts]
    assert len(a.prompts) == 30


def test_chat_records_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                                             {"role": "user", "content": "more"}]}))
    assert sorted(p.text for p in load_prompts("jsonl", str(path), 0).prompts) == ["hi", "more"]
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b", "a"], "id": ["1", "2", "3"]}), table)
    assert sorted(p.text for p in load_prompts("parquet", str(table), 0).prompts) == ["a", "b"]


def test_jsonl_error_names_the_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "ok"}\n{"prompt": oops}\n')
    with pytest.raises(ValueError, match="p.jsonl:2"):
        load_prompts("jsonl", str(path), 0)


def test_split_is_per_conversation_and_stable():
    ids = [f"conv{i}" for i in range(2000)]
    splits = [split_for(i, 0.1) for i in ids]
    assert 0.07 < splits.count("val") / len(ids) < 0.13
    assert splits == [split_for(i, 0.1) for i in ids]  # independent of how many prompts are loaded


def test_user_ids_with_underscores_stay_distinct_conversations(tmp_path):
    """Only ShareGPT's `id_N` part suffixes are joined; a user's `item_0, item_1` are separate conversations."""
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": f"q{i}", "id": f"item_{i}"}) for i in range(200)))
    prompts = load_prompts("jsonl", str(path), 0).prompts
    assert len({p.conversation_id for p in prompts}) == 200
    assert 0 < sum(split_for(p.conversation_id, 0.2) == "val" for p in prompts) < 200


def test_byte_order_mark_is_read_as_utf8(tmp_path):
    lines = [json.dumps({"id": "a", "prompt": "first"}), json.dumps({"id": "b", "prompt": "second"})]
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode() + b"\n")
    assert sorted(p.text for p in load_prompts("jsonl", str(path), 0).prompts) == ["first", "second"]
    sharegpt = tmp_path / "bom.json"
    sharegpt.write_bytes(b"\xef\xbb\xbf" + _sharegpt([[{"from": "human", "value": "hi"}]]).encode())
    assert [p.text for p in load_prompts("sharegpt", str(sharegpt), 0).prompts] == ["hi"]


def test_crlf_blank_lines_and_non_ascii_text(tmp_path):
    texts = ["Grüß Gott, wie geht's?", "日本語で答えてください", "emoji 🚀 and ünïcödé"]
    body = "\r\n\r\n".join(json.dumps({"id": str(i), "prompt": t}, ensure_ascii=i % 2 == 0)
                           for i, t in enumerate(texts))
    path = tmp_path / "crlf.jsonl"
    path.write_bytes(("\r\n" + body + "\r\n   \r\n").encode())
    assert sorted(p.text for p in load_prompts("jsonl", str(path), 0).prompts) == sorted(texts)
    sharegpt = tmp_path / "crlf.json"
    sharegpt.write_bytes(_sharegpt([[{"from": "human", "value": t}] for t in texts]).replace("\n", "\r\n")
                         .encode())
    assert sorted(p.text for p in load_prompts("sharegpt", str(sharegpt), 0).prompts) == sorted(texts)
