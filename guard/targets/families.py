"""The flax and torch targets' mapping: each architecture transformers 4.x has in both PyTorch and Flax.

One row per ``model_type``, literal and greppable (the targets' rows are ``guard.targets.table``'s).
Together with the generic rules in ``guard.convert.map.rules`` it gives every Flax name, nesting
and shape without importing transformers; ``tests/test_convert_families.py`` proves each row
against transformers' own classes (the Flax ``params_shape_tree``, the PyTorch buffers and class attributes),
so a row can only be right or a failing test.

Fields (regexes are searched against the PyTorch name, anchored at the end):
- ``prefix``: ``base_model_prefix``, the module a head class holds its base model under.
- ``classes``: the PyTorch classes whose Flax twin (``Flax`` + name) exists; the first is the base.
- ``roots``: every top-level module or parameter name of those classes (prefix stripped).
- ``norm_weight``: the Flax norm keeps PyTorch's ``weight`` (RMSNorm, T5 LayerNorm), not ``scale``.
- ``buffers``: buffers PyTorch holds or older versions saved, which the Flax class never does
  (non-persistent buffers, ``_keys_to_ignore_on_load_unexpected``, old rotary ``inv_freq``).
- ``computed``: frozen sinusoidal tables PyTorch stores and Flax computes; rebuilt on the way back.
- ``unsaved``: per class, tensors its ``save_pretrained`` leaves out (``_keys_to_ignore_on_save``):
  the way back writes exactly what that save would hold, so these are not rebuilt.
- ``pt_only``: per class, tensors the PyTorch class holds and its Flax twin has no place for.
- ``tied``: aliases of another tensor (output embeddings); ``always`` ones tie whatever the config says.
- ``tie_default``: the config class's ``tie_word_embeddings`` default.
- ``parts``: composites: top-level module -> the config key of its sub-config.
- ``base_requires``: roots the Flax base class always holds, which a head checkpoint may lack.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from guard.records import Record


class Family(Record):
    prefix: str
    classes: tuple[str, ...]
    roots: frozenset[str]
    norm_weight: bool = False
    buffers: tuple[str, ...] = ()
    computed: tuple[str, ...] = ()
    unsaved: Mapping[str, tuple[str, ...]] = MappingProxyType({})
    pt_only: Mapping[str, tuple[str, ...]] = MappingProxyType({})
    tied: tuple[str, ...] = ()
    always_tied: tuple[str, ...] = ()
    tie_default: bool = True
    parts: Mapping[str, str] = MappingProxyType({})
    base_requires: tuple[str, ...] = ()  # roots the Flax base class always holds (BERT's pooler)


def _roots(*names: str) -> frozenset[str]:
    return frozenset(names)


POOLER = ("pooler",)
BERT_BUFFERS = (r"embeddings\.position_ids", r"embeddings\.token_type_ids")
ROTARY = (r"rotary_emb\.inv_freq",)  # 4.57 holds one under the model; older versions saved one per layer
MLM_TIED = (r"predictions\.decoder\.weight",)
MLM_BIAS = (r"predictions\.decoder\.bias",)  # the head's own `bias` under another name, in every version
SEQ2SEQ_TIED = (r"^lm_head\.weight",)
SHARED_INPUTS = (r"(^|\.)encoder\.embed_tokens\.weight", r"(^|\.)decoder\.embed_tokens\.weight")  # = `shared`
SEQ2SEQ_BUFFERS = (r"(^|\.)encoder\.version", r"(^|\.)decoder\.version")
T5_BUFFERS = (r"decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight",)
BART_ROOTS = _roots("model", "shared", "encoder", "decoder", "lm_head", "final_logits_bias", "classification_head",
                    "qa_outputs")
BERT_ROOTS = ("embeddings", "encoder", "pooler", "classifier", "qa_outputs")
ROBERTA_CLASSES = ("Model", "ForCausalLM", "ForMaskedLM", "ForMultipleChoice", "ForQuestionAnswering",
                   "ForSequenceClassification", "ForTokenClassification")
T5_ROOTS = _roots("shared", "encoder", "decoder", "lm_head")


def _named(stem: str, suffixes: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(stem + s for s in suffixes)


FAMILIES: dict[str, Family] = {
    "albert": Family("albert", _named("Albert", ("Model", "ForMaskedLM", "ForMultipleChoice", "ForPreTraining",
                                                   "ForQuestionAnswering", "ForSequenceClassification",
                                                   "ForTokenClassification")),
                     _roots("albert", *BERT_ROOTS, "predictions", "sop_classifier"), buffers=BERT_BUFFERS,
                     tied=MLM_TIED, always_tied=MLM_BIAS, base_requires=POOLER),
    "bart": Family("model", _named("Bart", ("Model", "ForCausalLM", "ForConditionalGeneration",
                                              "ForQuestionAnswering", "ForSequenceClassification")),
                   BART_ROOTS, buffers=SEQ2SEQ_BUFFERS, tied=SEQ2SEQ_TIED, always_tied=SHARED_INPUTS),
    "beit": Family("beit", ("BeitModel", "BeitForImageClassification"),
                   _roots("beit", "embeddings", "encoder", "pooler", "classifier"),
                   buffers=(r"relative_position_index",)),
    "bert": Family("bert", _named("Bert", ("Model", "ForMaskedLM", "ForMultipleChoice", "ForNextSentencePrediction",
                                             "ForPreTraining", "ForQuestionAnswering", "ForSequenceClassification",
                                             "ForTokenClassification")) + ("BertLMHeadModel",),
                   _roots("bert", *BERT_ROOTS, "cls"), buffers=BERT_BUFFERS, tied=MLM_TIED, always_tied=MLM_BIAS,
                   base_requires=POOLER),
    "big_bird": Family("bert", _named("BigBird", ("Model", "ForCausalLM", "ForMaskedLM", "ForMultipleChoice",
                                                    "ForPreTraining", "ForQuestionAnswering",
                                                    "ForSequenceClassification", "ForTokenClassification")),
                       _roots("bert", *BERT_ROOTS, "cls", "qa_classifier"), buffers=BERT_BUFFERS,
                       tied=MLM_TIED, always_tied=MLM_BIAS,
                       pt_only={c: (r"^bert\.pooler\..*",) for c in ("BigBirdForCausalLM", "BigBirdForMaskedLM",
                                                                    "BigBirdForTokenClassification")},
                       base_requires=POOLER),
    "blenderbot": Family("model", ("BlenderbotModel", "BlenderbotForConditionalGeneration"), BART_ROOTS,
                         tied=SEQ2SEQ_TIED, always_tied=SHARED_INPUTS),
    "blenderbot-small": Family("model", ("BlenderbotSmallModel", "BlenderbotSmallForConditionalGeneration"),
                               BART_ROOTS, tied=SEQ2SEQ_TIED, always_tied=SHARED_INPUTS),
    "bloom": Family("transformer", ("BloomModel", "BloomForCausalLM"),
                    _roots("transformer", "word_embeddings", "word_embeddings_layernorm", "h", "ln_f", "lm_head"),
                    tied=(r"^lm_head\.weight",)),
    "clip": Family("clip", ("CLIPModel",),
                   _roots("text_model", "vision_model", "text_projection", "visual_projection", "logit_scale"),
                   buffers=(r"embeddings\.position_ids",)),
    "dinov2": Family("dinov2", ("Dinov2Model", "Dinov2ForImageClassification"),
                     _roots("dinov2", "embeddings", "encoder", "layernorm", "classifier")),
    "distilbert": Family("distilbert", _named("DistilBert", ("Model", "ForMaskedLM", "ForMultipleChoice",
                                                               "ForQuestionAnswering", "ForSequenceClassification",
                                                               "ForTokenClassification")),
                         _roots("distilbert", "embeddings", "transformer", "vocab_transform", "vocab_layer_norm",
                                "vocab_projector", "pre_classifier", "classifier", "qa_outputs"),
                         buffers=(r"embeddings\.position_ids",), tied=(r"^vocab_projector\.weight",)),
    "electra": Family("electra", _named("Electra", ("Model", "ForCausalLM", "ForMaskedLM", "ForMultipleChoice",
                                                      "ForPreTraining", "ForQuestionAnswering",
                                                      "ForSequenceClassification", "ForTokenClassification")),
                      _roots("electra", "embeddings", "embeddings_project", "encoder", "classifier", "qa_outputs",
                             "discriminator_predictions", "generator_predictions", "generator_lm_head",
                             "sequence_summary"),
                      buffers=BERT_BUFFERS, tied=(r"^generator_lm_head\.weight",)),
    "encoder-decoder": Family("encoder_decoder", ("EncoderDecoderModel",), _roots("encoder", "decoder"),
                              parts={"encoder": "encoder", "decoder": "decoder"}),
    "gemma": Family("model", ("GemmaModel", "GemmaForCausalLM"), _roots("model", "embed_tokens", "layers", "norm",
                                                                       "lm_head"),
                    norm_weight=True, buffers=ROTARY, tied=(r"^lm_head\.weight",)),
    "gpt2": Family("transformer", ("GPT2Model", "GPT2LMHeadModel"),
                   _roots("transformer", "wte", "wpe", "h", "ln_f", "lm_head"),
                   buffers=(r"\.(attn|crossattention)\.bias", r"\.(attn|crossattention)\.masked_bias"),
                   tied=(r"^lm_head\.weight",)),
    "gpt_neo": Family("transformer", ("GPTNeoModel", "GPTNeoForCausalLM"),
                      _roots("transformer", "wte", "wpe", "h", "ln_f", "lm_head"),
                      buffers=(r"\.attn\.attention\.bias", r"\.attn\.attention\.masked_bias"),
                      tied=(r"^lm_head\.weight",)),
    "gptj": Family("transformer", ("GPTJModel", "GPTJForCausalLM"),
                   _roots("transformer", "wte", "h", "ln_f", "lm_head"),
                   buffers=(r"\.attn\.bias", r"\.attn\.masked_bias", r"\.attn\.embed_positions"),
                   tied=(r"^lm_head\.weight",), tie_default=False),
    "llama": Family("model", ("LlamaModel", "LlamaForCausalLM"), _roots("model", "embed_tokens", "layers", "norm",
                                                                       "lm_head"),
                    norm_weight=True, buffers=ROTARY, tied=(r"^lm_head\.weight",), tie_default=False),
    "longt5": Family("transformer", ("LongT5Model", "LongT5ForConditionalGeneration"), T5_ROOTS, norm_weight=True,
                     buffers=T5_BUFFERS, tied=SEQ2SEQ_TIED, always_tied=SHARED_INPUTS),
    "marian": Family("model", ("MarianModel", "MarianMTModel"), BART_ROOTS, tied=SEQ2SEQ_TIED,
                     always_tied=SHARED_INPUTS,
                     computed=(r"(^|\.)(encoder|decoder)\.embed_positions\.weight",),
                     unsaved={"MarianMTModel": (r"^model\.(encoder|decoder)\.embed_positions\.weight",)}),
    "mbart": Family("model", _named("MBart", ("Model", "ForConditionalGeneration", "ForQuestionAnswering",
                                                "ForSequenceClassification")), BART_ROOTS, tied=SEQ2SEQ_TIED,
                    always_tied=SHARED_INPUTS),
    "mistral": Family("model", ("MistralModel", "MistralForCausalLM"),
                      _roots("model", "embed_tokens", "layers", "norm", "lm_head"),
                      norm_weight=True, buffers=ROTARY, tied=(r"^lm_head\.weight",), tie_default=False),
    "mt5": Family("transformer", ("MT5Model", "MT5ForConditionalGeneration"), T5_ROOTS, norm_weight=True,
                  buffers=T5_BUFFERS, tied=SEQ2SEQ_TIED, always_tied=SHARED_INPUTS, tie_default=False),
    "opt": Family("model", ("OPTModel", "OPTForCausalLM"), _roots("model", "decoder", "lm_head"),
                  tied=(r"^lm_head\.weight",)),
    "pegasus": Family("model", ("PegasusModel", "PegasusForConditionalGeneration"), BART_ROOTS, tied=SEQ2SEQ_TIED,
                      always_tied=SHARED_INPUTS,
                      computed=(r"(^|\.)(encoder|decoder)\.embed_positions\.weight",)),
    "regnet": Family("regnet", ("RegNetModel", "RegNetForImageClassification"),
                     _roots("regnet", "embedder", "encoder", "classifier")),
    "resnet": Family("resnet", ("ResNetModel", "ResNetForImageClassification"),
                     _roots("resnet", "embedder", "encoder", "classifier")),
    "roberta": Family("roberta", _named("Roberta", ROBERTA_CLASSES), _roots("roberta", *BERT_ROOTS, "lm_head"),
                      buffers=BERT_BUFFERS, tied=(r"^lm_head\.decoder\.weight",),
                      always_tied=(r"^lm_head\.decoder\.bias",), base_requires=POOLER),
    "roberta-prelayernorm": Family("roberta_prelayernorm", _named("RobertaPreLayerNorm", ROBERTA_CLASSES),
                                   _roots("roberta_prelayernorm", *BERT_ROOTS, "LayerNorm", "lm_head"),
                                   buffers=BERT_BUFFERS, tied=(r"^lm_head\.decoder\.weight",),
                                   always_tied=(r"^lm_head\.decoder\.bias",), base_requires=POOLER),
    "roformer": Family("roformer", _named("RoFormer", ("Model", "ForMaskedLM", "ForMultipleChoice",
                                                         "ForQuestionAnswering", "ForSequenceClassification",
                                                         "ForTokenClassification")),
                       _roots("roformer", "embeddings", "encoder", "cls", "classifier", "qa_outputs"),
                       computed=(r"encoder\.embed_positions\.weight",), tied=MLM_TIED, always_tied=MLM_BIAS),
    "speech-encoder-decoder": Family("speech_encoder_decoder", ("SpeechEncoderDecoderModel",),
                                     _roots("encoder", "decoder", "enc_to_dec_proj"),
                                     parts={"encoder": "encoder", "decoder": "decoder"}),
    "t5": Family("transformer", ("T5Model", "T5ForConditionalGeneration"), T5_ROOTS, norm_weight=True,
                 buffers=T5_BUFFERS, tied=SEQ2SEQ_TIED, always_tied=SHARED_INPUTS),
    "vision-encoder-decoder": Family("vision_encoder_decoder", ("VisionEncoderDecoderModel",),
                                     _roots("encoder", "decoder", "enc_to_dec_proj"),
                                     parts={"encoder": "encoder", "decoder": "decoder"}),
    "vision-text-dual-encoder": Family("vision_text_dual_encoder", ("VisionTextDualEncoderModel",),
                                       _roots("vision_model", "text_model", "visual_projection", "text_projection",
                                              "logit_scale"),
                                       parts={"vision_model": "vision_config", "text_model": "text_config"}),
    "vit": Family("vit", ("ViTModel", "ViTForImageClassification"),
                  _roots("vit", "embeddings", "encoder", "layernorm", "pooler", "classifier")),
    "wav2vec2": Family("wav2vec2", ("Wav2Vec2Model", "Wav2Vec2ForPreTraining"),
                       _roots("wav2vec2", "feature_extractor", "feature_projection", "encoder", "masked_spec_embed",
                              "quantizer", "project_hid", "project_q")),
    "whisper": Family("model", ("WhisperModel", "WhisperForConditionalGeneration", "WhisperForAudioClassification"),
                      _roots("model", "encoder", "decoder", "proj_out", "projector", "classifier", "layer_weights"),
                      tied=(r"^proj_out\.weight",)),
    "xglm": Family("model", ("XGLMModel", "XGLMForCausalLM"),
                   _roots("model", "embed_tokens", "layers", "layer_norm", "lm_head"),
                   buffers=(r"embed_positions\.weights",), tied=(r"^lm_head\.weight",)),
    "xlm-roberta": Family("roberta", _named("XLMRoberta", ROBERTA_CLASSES), _roots("roberta", *BERT_ROOTS, "lm_head"),
                          buffers=BERT_BUFFERS, tied=(r"^lm_head\.decoder\.weight",),
                          always_tied=(r"^lm_head\.decoder\.bias",), base_requires=POOLER),
}
FLAX_NAMES = {"BertLMHeadModel": "FlaxBertForCausalLM"}  # the twins whose names differ by more than "Flax"
ALIASES = {"gpt-sw3": "gpt2"}  # model types transformers maps to another type's classes
