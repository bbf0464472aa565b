"""The rule catalogue: one literal table.  Codes are stable forever.

Docs and ``ckpt-guard rules`` are generated from this table; a test checks the
README lists every code.
"""

from __future__ import annotations

from guard.findings import Finding, Severity
from guard.records import Record


class Rule(Record):
    code: str
    name: str
    severity: Severity
    needs: str  # "headers" | "values" | "conversion" | "hub"
    summary: str
    example: str
    fix: str


E, W, N = Severity.error, Severity.warning, Severity.note

RULES: tuple[Rule, ...] = (
    Rule("CG001", "unreadable-checkpoint", E, "headers",
         "The file cannot be parsed as the checkpoint format its name or magic bytes claim.",
         "model.safetensors whose header length is 2^40, or a .bin zip without data.pkl.",
         "Re-export the checkpoint; check the upload or download was not truncated."),
    Rule("CG002", "lfs-pointer", E, "headers",
         "A Git LFS pointer file stands where weights should be.",
         "model.safetensors is 134 bytes starting with 'version https://git-lfs.github.com/spec/v1'.",
         "Set `lfs: true` on actions/checkout, or run `git lfs pull` before scanning."),
    Rule("CG003", "unsafe-pickle", E, "headers",
         "A pickle references a global outside the tensor allowlist; it was never imported or called.",
         "pytorch_model.bin whose data.pkl calls `os.system` through a REDUCE opcode.",
         "Do not load the file. Re-export the weights as safetensors from a trusted source."),
    Rule("CG004", "shard-index-mismatch", E, "headers",
         "A shard index and its shards disagree: missing shards or tensors, or tensors the index does not list.",
         "model.safetensors.index.json maps `lm_head.weight` to a shard that does not contain it.",
         "Regenerate the index with save_pretrained, or upload the missing shard."),
    Rule("CG005", "unknown-dtype", W, "headers",
         "A tensor declares a dtype this tool does not know; it is reported once per file.",
         "A safetensors header with `\"dtype\": \"Q4_K\"`.",
         "Use a dtype safetensors defines, or ignore CG005 for this file with per-file-ignores."),
    Rule("CG006", "unsupported-format", W, "headers",
         "A file that looks like weights (by suffix or magic bytes) that no reader handles, or whose "
         "reader needs an extra that is not installed. It is named, never skipped in silence.",
         "model-q4_k_m.mlmodel beside the safetensors weights, or tf_model.h5 without the hdf5 extra.",
         "Install the extra the message names, or scan the file with its own tools; ignore CG006 for "
         "files you do not publish."),
    Rule("CG007", "no-tensors", N, "headers",
         "A weight file that holds no tensors: its header declares none (llama.cpp's vocab-only GGUF), or "
         "its format has no count and none was found. A header that declares tensors none of which could "
         "be read is CG001, never a silent pass.",
         "ggml-vocab-llama.gguf: a tokenizer and tensor_count 0; or torch.save({}, \"pytorch_model.bin\").",
         "Nothing to do for a vocab-only or tokenizer file; otherwise check that the export wrote the "
         "weights (an empty state dict saves without an error)."),
    Rule("CG008", "pickle-only", N, "headers",
         "A weight set stored only as a torch pickle (pytorch_model.bin, its shards, "
         "diffusion_pytorch_model.bin, adapter_model.bin) with no safetensors copy of the same variant: "
         "torch.load must unpickle it, while a safetensors copy loads without executing anything.",
         "A model folder with pytorch_model.bin and config.json, and no model.safetensors.",
         "`ckpt-guard fix --write` writes model.safetensors (or shards and their index) beside it, "
         "bit-exactly and without running the pickle; tied names are kept once, as save_pretrained does."),
    Rule("CG009", "gguf-type-unreadable", E, "headers",
         "A GGUF tensor whose ggml type id is outside ggml's registry, or one ggml keeps with no block size "
         "(4-5, 31-33, 36-38: removed): llama.cpp refuses the whole file. The message names the tensor and "
         "the id.",
         "An ollama gpt-oss blob whose MXFP4 experts are stored as ggml type 4, where ggml's MXFP4 is 39 "
         "(ollama#11796, llama.cpp#15597).",
         "Convert the weights again with llama.cpp's convert_hf_to_gguf.py (MXFP4 as type 39), or use the "
         "runtime whose own fork wrote the type; do not publish the file as a GGUF for llama.cpp."),
    Rule("CG010", "no-checkpoint-found", W, "headers",
         "A directory named on the command line holds no checkpoint: no weights, shard index or training "
         "checkpoint in it or below it. A scan of it checks nothing, so a gate pointed at the wrong folder "
         "would pass; files named one by one (the pre-commit hook's) never get it.",
         "`ckpt-guard scan --fail-on warning models/` in CI where the weights were written to `outputs/`.",
         "Point the scan at the folder that holds the weights (or fetch them first: `git lfs pull`, a "
         "download step); ignore CG010 where an empty folder is expected."),
    Rule("CG101", "unexpected-dtype", E, "headers",
         "Floating tensors are not in the expected dtype (default fp32; see --expect).",
         "--expect fp32 and a model whose decoder weights are F16.",
         "Cast the checkpoint (`ckpt-guard convert --dtype fp32`), or set `expect` to what you mean."),
    Rule("CG102", "mixed-float-dtypes", E, "headers",
         "More than one floating dtype within one model, beyond the allowed keep-fp32 patterns. "
         "Integer and bool tensors never count.",
         "A BART whose encoder is F32 and decoder F16: Flax keeps both and optax fails on the mix.",
         "Convert to one dtype (`ckpt-guard convert --dtype fp32`), or list deliberate fp32 "
         "tensors with --keep-fp32 '*norm*'."),
    Rule("CG103", "config-dtype-mismatch", W, "headers",
         "config.json's torch_dtype / dtype (nested configs too) disagrees with the weights. An error when the "
         "config names a narrower float dtype than the weights hold (transformers 5 loads in the config's "
         "dtype by default, so the weights are rounded down silently; a .keras layer policy likewise); a "
         "warning when it is wider (loading widens exactly), when a variant saved last holds the config's "
         "dtype, or when torch_dtype and dtype disagree.",
         "config.json says \"torch_dtype\": \"bfloat16\" while every floating tensor is F32: an error; "
         "\"float32\" over BF16 weights: a warning.",
         "Set the config dtype to what the weights hold, or cast the weights."),
    Rule("CG104", "low-precision-norm", N, "headers",
         "Normalization parameters are stored in bf16/fp16; many recipes keep them in fp32.",
         "model.layers.0.input_layernorm.weight is BF16.",
         "Keep norms in fp32 (`convert --dtype bf16 --keep-fp32 '*norm*'`) or ignore CG104."),
    Rule("CG105", "float64-weights", W, "headers",
         "Floating weights in F64: twice the size of fp32, and JAX silently narrows them.",
         "A checkpoint saved from numpy float64 arrays.",
         "Cast to fp32 before publishing (`ckpt-guard convert --dtype fp32`)."),
    Rule("CG106", "dtype-unsupported-by-target", W, "headers",
         "A conversion target cannot hold a dtype as-is: BF16/F8 through plain numpy, "
         "F64/I64/U64 under JAX's default 32-bit mode, dtypes torch lacks.",
         "An I64 buffer bound for Flax becomes I32 unless jax_enable_x64 is set.",
         "Convert with ckpt-guard (bit views via ml_dtypes), or drop the target with --target."),
    Rule("CG107", "copies-disagree", E, "headers",
         "Two weight sets of one model that should hold the same weights disagree: dtypes weighted "
         "by parameters, or tensor names and shapes where the sets share a naming scheme.",
         "bart-large: pytorch_model.bin is F16 while flax_model.msgpack beside it is F32.",
         "Re-export every copy from the same weights (`ckpt-guard convert`), or delete the stale copy."),
    Rule("CG108", "variant-dtype-mismatch", E, "headers",
         "A file or variant whose name claims a dtype holds floating tensors of another dtype.",
         "model.fp16.safetensors whose tensors are F32, or model_fp16.onnx with F32 initializers.",
         "Re-save the variant in the dtype its name claims (`save_pretrained(variant=...)` after "
         "casting), or rename it."),
    Rule("CG109", "variant-incomplete", E, "headers",
         "A variant that some parts of a model have and others lack, or a variant's shards without "
         "their index; `from_pretrained(variant=...)` fails on exactly this.",
         "unet/diffusion_pytorch_model.fp16.safetensors exists but text_encoder/ has no fp16 file.",
         "Save every component with the same variant, or remove the partial variant."),
    Rule("CG110", "quantized-component-missing", E, "headers",
         "A quantized module's packed weight without a component its method needs (scales, zero points "
         "where the scheme is asymmetric, bitsandbytes' quant_state, MLX biases in affine mode). "
         "transformers fails to load it, or loads garbage.",
         "model.layers.0.mlp.down_proj.qweight with no model.layers.0.mlp.down_proj.scales (GPTQ).",
         "Re-export the quantized model with its quantizer; never drop companions when filtering tensors."),
    Rule("CG111", "quantized-shape-mismatch", E, "headers",
         "A packed payload or its scales disagree with the bits and group size the config declares, or "
         "with the logical shape the method records (a truncated payload, a wrong `bits`).",
         "GPTQ bits 4, group_size 128: qweight [512, 4096] where in=4096 needs [512, ...] but scales are [16, 4096].",
         "Fix quantization_config to what the quantizer used, or re-quantize."),
    Rule("CG112", "quantization-method-mismatch", E, "headers",
         "The config declares a quantization method while no tensor is packed that way, or tensors are "
         "packed by a method the config does not declare.",
         "quantization_config says gptq while the weights are plain F16 (a dequantized re-save), or "
         "weight_packed tensors with no quantization_config.",
         "Make config.json describe the weights: remove quantization_config after dequantizing, or add it."),
    Rule("CG113", "quantized-modules-mismatch", E, "headers",
         "Modules the config keeps unquantized (modules_to_not_convert, ignore, llm_int8_skip_modules, "
         "MLX per-module false) are packed, or modules it quantizes are stored unpacked.",
         "compressed-tensors `ignore: [\"lm_head\"]` with lm_head.weight_packed in the shards.",
         "Re-export with the quantizer, or correct the config's list of unquantized modules."),
    Rule("CG114", "training-rank-missing", E, "headers",
         "A rank's file that the training checkpoint's metadata expects is missing (DCP's `.metadata` "
         "names it; DeepSpeed's `partition_count` counts it): the checkpoint cannot be loaded or consolidated.",
         "ckpt/.metadata places model.layers.0.mlp.up_proj.weight in __1_0.distcp, which is not there.",
         "Copy the whole checkpoint folder again; every rank's file is needed."),
    Rule("CG115", "training-byte-range-invalid", E, "headers",
         "A byte range the training checkpoint's metadata gives runs past the end of its file, or overlaps "
         "another: a truncated copy, or metadata of another save.",
         "__0_0.distcp is 1,048,576 bytes but .metadata places a chunk at 1,040,000 + 16,384.",
         "Copy the checkpoint again from where it was written; do not mix files of two saves."),
    Rule("CG116", "training-chunks-not-tiling", E, "headers",
         "The chunks a training checkpoint stores for a tensor do not tile its global shape: a gap, an "
         "overlap, a chunk outside the shape, or a chunk with no bytes stored.",
         "model.embed_tokens.weight [32000, 4096] stored as rows 0-15999 and 16000-31998.",
         "Re-save from the training run; the metadata does not describe one whole tensor."),
    Rule("CG117", "training-metadata-missing", E, "headers",
         "A DCP checkpoint's `.distcp` files without its `.metadata`: torch writes `.metadata` last, so the "
         "save never finished, and nothing can load it.",
         "step-1000/ holds __0_0.distcp and __1_0.distcp and no .metadata.",
         "Use the last checkpoint whose save finished (it has a .metadata), or save again."),
    Rule("CG118", "zero-partition-size-mismatch", E, "headers",
         "A DeepSpeed ZeRO checkpoint's partitions do not add up to its `param_shapes`: the flat fp32 partitions "
         "hold more or fewer elements than the parameters they are said to hold, so no consolidation is right.",
         "global_step500/ whose two ranks' partitions hold 6,736 elements while param_shapes needs 6,800.",
         "Copy the tag folder again from the run; do not mix files of two saves or two world sizes."),
    Rule("CG119", "training-latest-tag-missing", E, "headers",
         "DeepSpeed's `latest` file (or Megatron's `latest_checkpointed_iteration.txt`) names a tag with no "
         "folder beside it: `zero_to_fp32.py` and `load_checkpoint` fail, and the newest save is missing.",
         "checkpoints/latest says global_step900, and checkpoints/ holds only global_step800/.",
         "Copy the missing tag folder, or write the tag that is there into `latest`."),
    Rule("CG120", "training-state-published", W, "headers",
         "A model repository holds training state (optimizer moments, master partitions, rank files): "
         "gigabytes users download for nothing, and the training run's internals.",
         "output_dir/global_step500/ with 6.1 GB of optimizer state pushed beside model.safetensors.",
         "Publish the consolidated weights (`ckpt-guard convert CKPT --to torch --out OUT`) and leave "
         "checkpoints out (`ignore_patterns=[\"global_step*\"]`)."),
    Rule("CG121", "training-only-weights", W, "headers",
         "The only weights in the repository are training partitions: no loadable model is published "
         "(ZeRO-3 or a sharded FSDP state dict makes `Trainer.save_model` write none). An error in the "
         "upload gate and the Hub reviewer.",
         "A repository with config.json and global_step500/*_optim_states.pt and no model.safetensors.",
         "Consolidate first: `ckpt-guard convert CKPT --to torch --out OUT`, and publish OUT."),
    Rule("CG122", "published-narrower-than-masters", N, "headers",
         "A published weight set beside the training state is narrower than the training state's master "
         "weights: the masters' precision stays behind.",
         "model.safetensors in BF16 beside global_step500/ whose fp32 masters are the model's real weights.",
         "Publish the masters: `ckpt-guard convert CKPT --to torch --out OUT` writes them as safetensors."),
    Rule("CG123", "weights-filled-at-random", E, "headers",
         "The class config.json names builds parameters no tensor in the file holds: transformers fills them at "
         "random and only logs it (an untied head, a vision tower a conversion stripped), or (experts missing from "
         "a per-expert file) merges the experts it finds into a tensor too short and refuses it. Judged against "
         "the table of what transformers 5's classes build (guard/inventory/architectures_table.py).",
         "A Qwen3-MoE with 4 experts whose file holds experts 0-1 of every layer (an expert-parallel save that "
         "never gathered them); an untied Llama without lm_head.weight.",
         "No mechanical fix: take the missing tensors from the run or checkpoint that was saved (every rank's "
         "file, the untied head), then save again."),
    Rule("CG124", "weights-dropped", W, "headers",
         "Tensors the class config.json names has no place for: transformers drops them when it loads, and only "
         "logs it (leftover layers or experts, names of another architecture).",
         "config.json says num_hidden_layers 2 while the file holds model.layers.2.*.",
         "Make config.json describe the weights (num_hidden_layers, num_experts), or remove the leftover tensors."),
    Rule("CG125", "shape-contradicts-config", E, "headers",
         "A tensor's shape disagrees with the size config.json gives it (hidden size, vocabulary, head dimension, "
         "expert count): transformers refuses to load it (a size mismatch).",
         "model.embed_tokens.weight [32000, 4096] while config.json says vocab_size 32064.",
         "Fix the config field the message names, or re-export the weights with the config they were trained with."),
    Rule("CG126", "fp32-keep-narrowed", W, "headers",
         "Tensors transformers keeps in fp32 on purpose (_keep_in_fp32_modules_strict, or _keep_in_fp32_modules "
         "under an fp16 config) are stored narrower. transformers keeps these in fp32; the precision was lost when "
         "the checkpoint was saved (loading widens them back, so nothing else shows it).",
         "DeepSeek-V3's mlp.gate.weight and e_score_correction_bias in BF16 after model.to(torch.bfloat16) "
         "and save_pretrained.",
         "Save again from fp32 weights (the training run's masters), or load with dtype=torch.bfloat16 rather than "
         "casting the model before saving."),
    Rule("CG127", "loading-not-checked", N, "headers",
         "config.json names a class (architectures) the table of what transformers builds has no row for, or "
         "lacks a field the table needs: CG123-CG125 did not run on this model.",
         "config.json with model_type 'mamba', which the table does not cover.",
         "Informational: check the model loads with from_pretrained(output_loading_info=True)."),
    Rule("CG128", "eos-token-mismatch", W, "headers",
         "generation_config.json's eos_token_id, beside a tokenizer (tokenizer_config.json, tokenizer.json), "
         "includes neither the tokenizer's eos_token nor config.json's EOS, is the pad token alone, or (with a "
         "chat template) lacks the template's end-of-turn token: generation runs to the token limit. An id "
         "outside the vocabulary is an error.",
         "generation_config.json with eos_token_id 151643 (<|endoftext|>, the pad token) beside a chat "
         "template that ends each turn with <|im_end|> (NousResearch/Hermes-4-14B).",
         "Set eos_token_id to the end-of-turn token's id (with the tokenizer's eos_token): "
         "GenerationConfig.save_pretrained with eos_token_id=[...]."),
    Rule("CG129", "quantization-runtime-caveat", N, "headers",
         "A legitimate quantized layout that named runtime versions are known to mishandle: a ModelOpt "
         "quant_algo NVFP4 set with input_activations null in every config group (weight-only, no input_scale "
         "tensors), which vLLM's NVFP4 MoE path before #54427 runs with its input scale read as 0 (vllm#54189).",
         "hf_quant_config.json / quantization_config: quant_algo NVFP4, config_groups.group_0.input_activations "
         "null, and no *.input_scale in the shards.",
         "Informational: serve with a runtime that has the fix (vLLM with #54427), or declare the set as what it "
         "is (quant_algo W4A16_NVFP4)."),
    Rule("CG201", "fp16-overflow", E, "values",
         "Values beyond ±65504 become inf when cast to fp16.",
         "An fp32 embedding with max |x| = 1.2e5 and --target torch:fp16.",
         "Keep the tensor in fp32/bf16, or rescale before casting."),
    Rule("CG202", "fp16-underflow", W, "values",
         "Non-zero values that flush to zero or lose precision in fp16 (|x| < 2^-14).",
         "Weights of magnitude 1e-8 that become 0 in fp16.",
         "Use bf16 instead of fp16, or keep the tensor in fp32."),
    Rule("CG203", "non-finite-values", E, "values",
         "NaN or Inf values in the weights.",
         "A diverged fine-tune saved with NaN in a layer norm.",
         "Re-export from a healthy checkpoint."),
    Rule("CG204", "lossy-downcast", N, "values",
         "The rounding error of casting to the requested narrower dtype.",
         "fp32 weights cast to bf16: max relative error 3.9e-3.",
         "Informational; keep sensitive tensors in fp32 with --keep-fp32."),
    Rule("CG205", "invalid-quantization-scale", E, "values",
         "Quantization scales that are NaN, Inf, zero or negative where the scheme forbids it, "
         "or E8M0 scales of 0xFF (NaN): every weight they scale dequantizes to garbage.",
         "model.layers.3.mlp.experts.down_proj_scales holds 0xFF bytes (MXFP4).",
         "Re-quantize from the full-precision weights."),
    Rule("CG206", "fp8-saturated", W, "values",
         "An FP8 payload with many values at the format's maximum (448 for E4M3, 57344 for E5M2): a cast "
         "with no scaling, which clips every larger weight.",
         "model.layers.0.mlp.up_proj.weight F8_E4M3 with 3% of its values at ±448 and weight_scale 1.0.",
         "Quantize with per-tensor or per-block scales (the quantizer's calibration), not a bare cast."),
    Rule("CG207", "dead-weights", W, "values",
         "Weight matrices whose every value is zero, or one constant, reported by group (the MLP weights of "
         "layers 0-29). Biases, vectors and the pieces model classes zero-initialise (LoRA's lora_B, vision "
         "tokens) are not reported.",
         "bitnet-b1.58-2B-4T (microsoft/BitNet#608): every model.layers.N.mlp.*_proj.weight is all zero.",
         "Re-export from the training run's weights; check the conversion or upload that produced the file."),
    Rule("CG208", "gptq-zero-point-format", E, "values",
         "A symmetric GPTQ set whose stored zero points are in the other checkpoint_format's convention: "
         "gptq (v1) stores zero - 1 (7 for 4 bits), gptq_v2 stores the zero itself (8). Loaders follow "
         "checkpoint_format, so every weight is dequantized one quantization step off.",
         "Qwen3.5-27B-GPTQ-Int4 (vllm#38966): qzeros nibbles all 8 under checkpoint_format \"gptq\".",
         "Set quantization_config.checkpoint_format to what the zero points are (gptq_v2 for 8), or re-save "
         "with the quantizer in the declared format."),
    Rule("CG301", "roundtrip-not-exact", E, "conversion",
         "A same-dtype conversion changed tensor bytes; or (a warning) a target's own convention rounds a tensor, "
         "declared with the count of elements that will not convert back bit-exactly.",
         "A bf16 tensor that went through an fp32 bridge and lost its NaN payload; MaxText's query kernel, scaled "
         "by 1/sqrt(head_dim) in f32 and cast back.",
         "Report a bug; ckpt-guard conversions are bit-exact by design. A declared rounding is the target's own "
         "layout: keep the source checkpoint as the master copy."),
    Rule("CG302", "parity-failed", E, "conversion",
         "PyTorch and Flax outputs differ beyond the dtype's tolerance, or a side reads a config value that "
         "makes the model (rope_theta, RoPE scaling, dtype, sizes) otherwise than the source's config.json means; "
         "or (parity --against) a JAX stack's own loader holds a parameter other than the file's bits (rounded, "
         "narrowed, reinterpreted) or its forward misses PyTorch's.",
         "max |Δ| / max |ref| = 0.3 on BART logits after conversion.",
         "Check GELU approximation, LayerNorm eps and kernel layout; compare in fp32 first."),
    Rule("CG303", "parity-unavailable", N, "conversion",
         "transformers has no paired PyTorch/Flax architecture for this model_type.",
         "model_type 'mamba' has no Flax class in transformers 4.x.",
         "Informational: the weights were converted but outputs could not be compared."),
    Rule("CG304", "key-or-shape-mismatch", E, "conversion",
         "Tensors missing, unexpected, or of the wrong shape for the target architecture; or an architecture, "
         "or a config value (a RoPE base or scaling), the target's classes cannot compute; or (parity --against) "
         "a tensor a JAX stack's loader leaves out, or a parameter it holds that no tensor fills.",
         "decoder.layers.3.fc1.weight has no place in the Flax parameter tree.",
         "Check the config matches the weights; never load with missing keys left random."),
    Rule("CG401", "not-scannable-remotely", N, "hub",
         "A Hub file could not be scanned through ranged reads.",
         "A legacy pickle larger than the remote read budget.",
         "Scan the file locally after download."),
)

RULES_BY_CODE: dict[str, Rule] = {rule.code: rule for rule in RULES}


def make_finding(
    code: str, path: str, message: str, *, tensor: str | None = None, line: int | None = None
) -> Finding:
    """A Finding with the rule's default severity (policy may change it later)."""
    return Finding(code, RULES_BY_CODE[code].severity, path, message, tensor, line)
