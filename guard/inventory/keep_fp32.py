"""The tensors transformers keeps in fp32 on purpose, per ``model_type``: data, not findings.

A model class's ``_keep_in_fp32_modules_strict`` stays fp32 when transformers loads it in bf16 or
fp16 (DeepSeek-V3's router ``mlp.gate.weight`` and ``e_score_correction_bias``), and its
``_keep_in_fp32_modules`` when it loads in fp16 (T5's ``wo``, which overflows in fp16).  A
checkpoint that holds those tensors in fp32 beside bf16 weights is written as transformers meant
it: CG101/CG102 leave them out and ``fix`` never narrows them (the rules add these names to the
keep-fp32 globs of a model whose config.json names the ``model_type``).

Read from transformers 5.25.0's model classes (``models/*/modeling_*.py``, each class's literal
lists, united per model_type as transformers unites a model's submodules' lists) by
``scripts/keep_fp32_table.py``; regenerate it with a newer wheel and review the difference.

An entry names a module or parameter path, matched as transformers 4.57 matches it: whole
dot-separated components anywhere in the tensor name (``gate.weight`` keeps
``model.layers.3.mlp.gate.weight``, never ``mlp.gate_proj.weight``).  transformers 5 searches the
entry as a regular expression anywhere in the name; the component match is the narrower of the two,
so nothing is left out here that transformers would not keep.
"""

from __future__ import annotations

from guard.records import Record

TRANSFORMERS_VERSION = "5.25.0"  # the wheel the table was read from


class Keeps(Record):
    strict: tuple[str, ...] = ()  # fp32 whatever the load dtype (bf16 or fp16)
    fp16: tuple[str, ...] = ()  # fp32 when loaded in fp16 (the fp16-overflow cases)


KEEP_IN_FP32: dict[str, Keeps] = {
    'afmoe': Keeps(strict=('expert_bias',), fp16=('input_layernorm', 'k_norm', 'norm', 'post_attention_layernorm',
            'post_mlp_layernorm', 'pre_mlp_layernorm', 'q_norm')),
    'apertus1p5': Keeps(strict=('audio_tokenizer', 'vision_tokenizer')),
    'axk1': Keeps(strict=('e_score_correction_bias', 'gate.weight')),
    'axk2': Keeps(strict=('e_score_correction_bias', 'gate.weight'), fp16=('indexer.weights_proj',)),
    'bailing_hybrid': Keeps(strict=('A_log', 'conv1d', 'dt_bias', 'e_score_correction_bias', 'gate.weight')),
    'beam': Keeps(strict=('e_score_correction_bias', 'mlp.gate.weight')),
    'blip-2': Keeps(fp16=('qformer', 'query_tokens')),
    'deepseek_ocr2_text': Keeps(strict=('gate.weight',)),
    'deepseek_v2': Keeps(strict=('gate.weight',)),
    'deepseek_v3': Keeps(strict=('e_score_correction_bias', 'gate.weight')),
    'deepseek_v32': Keeps(strict=('e_score_correction_bias', 'gate.weight'), fp16=('indexer.weights_proj',)),
    'deepseek_v4': Keeps(strict=('attn_hc', 'e_score_correction_bias', 'ffn_hc', 'hc_head', 'input_layernorm',
            'kv_norm', 'norm', 'position_bias', 'post_attention_layernorm', 'q_a_norm', 'sinks'),
            fp16=('self_attn.compressor.gate_proj', 'self_attn.compressor.indexer.gate_proj',
            'self_attn.compressor.indexer.kv_proj', 'self_attn.compressor.indexer.scorer.weights_proj',
            'self_attn.compressor.kv_proj')),
    'dots1': Keeps(strict=('e_score_correction_bias', 'gate.weight')),
    'dots3_note': Keeps(strict=('e_score_correction_bias', 'gate.weight')),
    'dots3_note_vision_encoder': Keeps(strict=('e_score_correction_bias', 'gate.weight')),
    'ergo': Keeps(strict=('attention_residual_gate', 'e_score_correction_bias', 'embed_tokens',
            'feedforward_residual_gate', 'input_layernorm', 'k_norm', 'mlp.gate.linear.weight', 'norm',
            'post_attention_layernorm', 'post_expert_norm', 'post_feedforward_layernorm',
            'pre_feedforward_layernorm', 'q_norm')),
    'ernie4_5_moe': Keeps(strict=('e_score_correction_bias', 'gate.weight')),
    'ernie4_5_vl_moe': Keeps(strict=('e_score_correction_bias', 'gate.weight')),
    'esmfold2': Keeps(strict=('boundaries', 'distogram_head', 'fourier', 'norm.bias', 'norm.weight', 'norm_mix',
            'norm_single', 'norm_start')),
    'exaone_moe': Keeps(strict=('e_score_correction_bias', 'gate.weight')),
    'flint': Keeps(strict=('gate.weight', 'sinks')),
    'glm4_moe': Keeps(strict=('e_score_correction_bias', 'gate.weight')),
    'glm4_moe_lite': Keeps(strict=('e_score_correction_bias', 'gate.weight')),
    'glm4v_moe': Keeps(strict=('e_score_correction_bias', 'gate.weight')),
    'glm5_next': Keeps(strict=('A_log', 'attn_hc.base', 'attn_hc.scale', 'conv1d', 'dt_bias',
            'e_score_correction_bias', 'ffn_hc.base', 'ffn_hc.scale', 'gate.weight')),
    'glm_moe_dsa': Keeps(strict=('e_score_correction_bias', 'gate.weight'), fp16=('indexer.weights_proj',)),
    'gpt_oss': Keeps(fp16=('input_layernorm', 'norm', 'post_attention_layernorm')),
    'gradium_phonon_tts': Keeps(strict=('freqs', 'latent_mean', 'latent_std')),
    'granite_speech5_ctc': Keeps(strict=('conv.norm',)),
    'hy_v3': Keeps(strict=('e_score_correction_bias', 'gate.weight')),
    'hy_v4': Keeps(strict=('base', 'e_score_correction_bias', 'fn', 'gate.weight', 'hc_base', 'hc_fn', 'hc_scale',
            'k_norm', 'lm_head', 'scale', 'sinks', 'weights_proj')),
    'hy_v4_vl': Keeps(strict=('base', 'e_score_correction_bias', 'fn', 'gate.weight', 'hc_base', 'hc_fn', 'hc_scale',
            'k_norm', 'lm_head', 'scale', 'sinks', 'weights_proj')),
    'inkling2': Keeps(strict=('attention_input', 'e_score_correction_bias', 'final_input', 'mlp.gate.weight',
            'mlp_input', 'post_attention_convolution', 'post_mlp_convolution', 'sconv.conv1d')),
    'inkling2_loop': Keeps(strict=('attention_input', 'e_score_correction_bias', 'final_input', 'forget_gate_proj',
            'message_gate_proj', 'message_input', 'mlp.gate.weight', 'mlp_input', 'post_attention_convolution',
            'post_mlp_convolution', 'sconv.conv1d')),
    'inkling_mm_model': Keeps(strict=('attn_sconv', 'e_score_correction_bias', 'gate.global_scale', 'k_sconv',
            'mlp_sconv', 'v_sconv')),
    'instructblip': Keeps(fp16=('query_tokens',)),
    'instructblipvideo': Keeps(fp16=('query_tokens',)),
    'kimi_linear': Keeps(strict=('dt_bias', 'e_score_correction_bias', 'gate.weight')),
    'kolibri1': Keeps(strict=('e_score_correction_bias',)),
    'kolibri1_1': Keeps(strict=('e_score_correction_bias',)),
    'kyutai_speech_to_text': Keeps(strict=('codec_model',)),
    'longcat_flash': Keeps(fp16=('classifier.weight',)),
    'mimo_v2_flash': Keeps(strict=('e_score_correction_bias', 'mlp.gate.weight')),
    'minicpm5_moe': Keeps(strict=('e_score_correction_bias', 'gate.weight')),
    'mistral_large4': Keeps(strict=('mlp.gate.weight', 'rotary_emb'), fp16=('indexer.weights_proj',)),
    'mt5': Keeps(fp16=('wo',)),
    'muse_spark': Keeps(strict=('e_score_correction_bias', 'mlp.gate.weight', 'post_attention_residual_gate',
            'post_feedforward_residual_gate')),
    'nemo_speechlm': Keeps(strict=('audio_tower', 'multi_modal_projector')),
    'nemotron_h': Keeps(strict=('e_score_correction_bias', 'gate.weight')),
    'openai_privacy_filter': Keeps(strict=('sinks',)),
    'pocket_tts': Keeps(strict=('freqs', 'latent_mean', 'latent_std')),
    'pop2piano': Keeps(fp16=('wo',)),
    'rwkv': Keeps(fp16=('time_decay', 'time_first')),
    'slanext': Keeps(strict=('structure_attention_cell', 'structure_generator')),
    'solar_open': Keeps(strict=('e_score_correction_bias', 'gate.weight')),
    't5': Keeps(fp16=('wo',)),
    'udop': Keeps(fp16=('wo',)),
    'umt5': Keeps(fp16=('wo',)),
    'unlimited_ocr_text': Keeps(strict=('gate.weight',)),
    'voxtral': Keeps(strict=('embed_positions',)),
}


def kept_modules(model_type: object) -> tuple[str, ...]:
    """Every entry (strict first) for a model_type; () for one the table does not name."""
    keeps = KEEP_IN_FP32.get(model_type) if isinstance(model_type, str) else None
    return keeps.strict + keeps.fp16 if keeps is not None else ()


def component_globs(entries: tuple[str, ...]) -> tuple[str, ...]:
    """keep-fp32 globs (``guard.config.fp32_keeper``'s syntax) that match each entry as whole components."""
    return tuple(glob for entry in entries for glob in (entry, f"{entry}.*", f"*.{entry}", f"*.{entry}.*"))
