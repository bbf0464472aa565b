"""Repository layouts written the way users write them: with diffusers, transformers, the Trainer,
PEFT, sentence-transformers and Lightning, on tiny random models.  Each builder returns the
parameter counts the library itself reports, for one copy."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from guard.samples import bart_like_copies, diffusers_pipeline, flax_copy, save_torch_bin

__all__ = ["bart_like_copies", "diffusers_pipeline", "flax_copy", "save_torch_bin", "lightning_checkpoint", "peft_lora",
           "sentence_transformer", "trainer_run", "transformers_copies", "transformers_fp16_variant"]


def _params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _tiny_bert():  # type: ignore[no-untyped-def]
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(vocab_size=99, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32)
    return BertForMaskedLM(config)


def transformers_copies(root: Path) -> int:
    """One BERT saved as safetensors and as .bin into one folder, and a Flax copy from_pt beside them
    (the .bin and the Flax copy as transformers 4 wrote them: guard.samples' writers)."""
    model = _tiny_bert()
    model.save_pretrained(root)
    save_torch_bin(model, root)
    flax_copy(root)
    return _params(model)


def transformers_fp16_variant(root: Path, *, max_shard_size: str = "4KB") -> int:
    """The default copy, then `save_pretrained(variant="fp16")` sharded (model.safetensors.index.fp16.json)."""
    model = _tiny_bert()
    model.save_pretrained(root)
    model.half().save_pretrained(root, variant="fp16", max_shard_size=max_shard_size)
    return _params(model)


class _Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": torch.tensor([1, 2, 3, 4]), "labels": torch.tensor(i % 2)}


def trainer_run(root: Path, *, dtype: torch.dtype = torch.float32) -> int:
    """A real Trainer run of two steps on CPU with save_steps=1: checkpoint-1/ and checkpoint-2/."""
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = BertConfig(vocab_size=99, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32)
    model = BertForSequenceClassification(config).to(dtype)
    args = TrainingArguments(str(root), max_steps=2, save_steps=1, per_device_train_batch_size=2, report_to=[],
                             use_cpu=True, disable_tqdm=True, logging_strategy="no", dataloader_num_workers=0)
    Trainer(model=model, args=args, train_dataset=_Tokens()).train()
    return _params(model)


def peft_lora(root: Path) -> int:
    """A LoRA adapter saved by PEFT: adapter_model.safetensors + adapter_config.json."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_tiny_bert(), LoraConfig(r=2, target_modules=["query", "value"]))
    model.save_pretrained(root)
    trainable, _ = model.get_nb_trainable_parameters()
    return int(trainable)


def sentence_transformer(root: Path) -> dict[str, int]:
    """A sentence-transformers model with a Dense module: the root, 1_Pooling/ and 2_Dense/."""
    from sentence_transformers import SentenceTransformer, models

    base = root.parent / f"{root.name}-base"
    from transformers import BertModel

    BertModel(_tiny_bert().config).save_pretrained(base)
    _clip_free_tokenizer(base)
    transformer = models.Transformer(str(base))
    pooling = models.Pooling(transformer.get_word_embedding_dimension())
    dense = models.Dense(in_features=pooling.get_sentence_embedding_dimension(), out_features=8)
    SentenceTransformer(modules=[transformer, pooling, dense], device="cpu").save(str(root))
    return {".": _params(transformer), "2_Dense": _params(dense)}


def _clip_free_tokenizer(folder: Path) -> None:
    from transformers import BertTokenizerFast

    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]) + "\n")
    BertTokenizerFast(str(vocab)).save_pretrained(folder)


def lightning_checkpoint(root: Path) -> int:
    """A real PyTorch Lightning fit of one step: a .ckpt holding state_dict and optimizer_states."""
    import pytorch_lightning as pl

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)

        def training_step(self, batch, _):  # type: ignore[no-untyped-def]
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.AdamW(self.parameters())

    os.environ.setdefault("PL_DISABLE_FORK", "1")
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 4)), batch_size=2)
    model = Tiny()
    trainer = pl.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(root), enable_checkpointing=False)
    trainer.fit(model, data)
    trainer.save_checkpoint(str(root / "last.ckpt"))
    return _params(model)
