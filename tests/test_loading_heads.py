"""Heads whose sizes are their own (a classifier's labels, a speaker-embedding projection), not a config's size
fields: a fine-tuned model saved by transformers 5.25 with sizes other than the default config's gets no finding
from the table, as transformers loads it with an empty report.  (The table once matched a head's dimension to the
one config field of the same value: a token classifier's 2 labels read as type_vocab_size, so every NER model of
9 labels was a false CG125.)"""

from __future__ import annotations

from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402
from scanning import json_scan  # noqa: E402

LOADING = ("CG123", "CG124", "CG125", "CG127")
SMALL = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_hidden_layers=2, vocab_size=96,
             max_position_embeddings=64)

HEADS: dict[str, tuple[str, str, dict[str, object]]] = {
    "roberta ner, 9 labels": ("roberta", "RobertaForTokenClassification", {**SMALL, "num_labels": 9}),
    "albert ner, 9 labels": ("albert", "AlbertForTokenClassification", {**SMALL, "embedding_size": 16,
                                                                        "num_labels": 9}),
    "distilbert sentiment, 3 labels": ("distilbert", "DistilBertForSequenceClassification", dict(
        dim=32, hidden_dim=48, n_heads=4, n_layers=2, vocab_size=96, max_position_embeddings=64, num_labels=3)),
    "deberta-v2 classifier, 5 labels": ("deberta-v2", "DebertaV2ForSequenceClassification", {**SMALL,
                                                                                             "num_labels": 5}),
    "wav2vec2 x-vector, 48 dims": ("wav2vec2", "Wav2Vec2ForXVector", dict(
        hidden_size=32, intermediate_size=48, num_attention_heads=4, num_hidden_layers=2, conv_dim=(16, 16),
        conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
        tdnn_dim=(24, 24, 40), tdnn_kernel=(5, 3, 1), tdnn_dilation=(1, 2, 1), xvector_output_dim=48,
        num_labels=7)),
}


@pytest.mark.parametrize("name", list(HEADS))
def test_a_head_of_its_own_size_is_no_finding(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    from guard.inventory.rows import rows_for

    model_type, class_name, fields = HEADS[name]
    assert class_name in (rows_for(model_type) or {}), "the table has the row this test is about"
    torch.manual_seed(0)
    config = transformers.CONFIG_MAPPING[model_type](**fields)
    getattr(transformers, class_name)(config).save_pretrained(tmp_path)
    _, info = getattr(transformers, class_name).from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    _, report = json_scan(capsys, str(tmp_path))
    assert [f for f in report["findings"] if f["code"] in LOADING] == []
