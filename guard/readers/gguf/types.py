"""GGUF's numbering: ggml tensor type ids and llama.cpp's ``general.file_type`` values.

Facts from ggml.h / llama.h as the ``gguf`` package (0.19) lists them
(``GGMLQuantizationType``, ``LlamaFileType``), plus the ids llama.cpp has retired
but files on the Hub still carry (marked).  Block sizes live in ``guard.dtypes``.
"""

from __future__ import annotations

# ggml type id -> dtype code (guard.dtypes: safetensors codes, then GGML_BLOCKS)
GGML_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1",
    # 4 Q4_2 and 5 Q4_3 were removed before GGUF existed
    6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K",
    16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
    23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16",
    31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8",  # retired (llama.cpp now repacks at load)
    34: "TQ1_0", 35: "TQ2_0",
    36: "IQ4_NL_4_4", 37: "IQ4_NL_4_8", 38: "IQ4_NL_8_8",  # retired, likewise
    39: "MXFP4", 40: "NVFP4", 41: "Q1_0",
}

# The ids ggml keeps in its enum with no block size (ggml.h: "removed", or "removed from gguf files, use Q4_0 and
# runtime repack"): ggml's GGUF loader refuses a tensor of any of them ("... not a multiple of block size (0)"), as it
# refuses an id past the registry ("invalid ggml type").  Ollama's gpt-oss blobs store their MXFP4 experts as 4, its
# own fork's id before ggml's 39 (ollama#11796, llama.cpp#15597).  The others' layouts are known (Q4_0's and
# IQ4_NL's blocks, interleaved), so their files are still placed; none of them loads in llama.cpp.
RETIRED: dict[int, str] = {
    4: "Q4_2", 5: "Q4_3", 31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8", 36: "IQ4_NL_4_4", 37: "IQ4_NL_4_8",
    38: "IQ4_NL_8_8",
}

# ggml's registry as llama.cpp reads it: every id with a block size (the gguf package's GGMLQuantizationType and
# GGML_QUANT_SIZES; tests/test_gguf_reader.py holds this table to them)
REGISTRY: dict[int, str] = {type_id: code for type_id, code in GGML_TYPES.items() if type_id not in RETIRED}

# general.file_type -> name (LLAMA_FTYPE_<name>); 1024 (GUESSED) may be added to any of them
FILE_TYPES: dict[int, str] = {
    0: "ALL_F32", 1: "MOSTLY_F16", 2: "MOSTLY_Q4_0", 3: "MOSTLY_Q4_1",
    4: "MOSTLY_Q4_1_SOME_F16",  # retired
    7: "MOSTLY_Q8_0", 8: "MOSTLY_Q5_0", 9: "MOSTLY_Q5_1",
    10: "MOSTLY_Q2_K", 11: "MOSTLY_Q3_K_S", 12: "MOSTLY_Q3_K_M", 13: "MOSTLY_Q3_K_L",
    14: "MOSTLY_Q4_K_S", 15: "MOSTLY_Q4_K_M", 16: "MOSTLY_Q5_K_S", 17: "MOSTLY_Q5_K_M",
    18: "MOSTLY_Q6_K", 19: "MOSTLY_IQ2_XXS", 20: "MOSTLY_IQ2_XS", 21: "MOSTLY_Q2_K_S",
    22: "MOSTLY_IQ3_XS", 23: "MOSTLY_IQ3_XXS", 24: "MOSTLY_IQ1_S", 25: "MOSTLY_IQ4_NL",
    26: "MOSTLY_IQ3_S", 27: "MOSTLY_IQ3_M", 28: "MOSTLY_IQ2_S", 29: "MOSTLY_IQ2_M",
    30: "MOSTLY_IQ4_XS", 31: "MOSTLY_IQ1_M", 32: "MOSTLY_BF16",
    33: "MOSTLY_Q4_0_4_4", 34: "MOSTLY_Q4_0_4_8", 35: "MOSTLY_Q4_0_8_8",  # retired
    36: "MOSTLY_TQ1_0", 37: "MOSTLY_TQ2_0", 38: "MOSTLY_MXFP4_MOE", 39: "MOSTLY_NVFP4",
    40: "MOSTLY_Q1_0",
}
